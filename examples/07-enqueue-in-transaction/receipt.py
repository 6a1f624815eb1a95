"""Send the receipt in the order's transaction: it exists only if the order commits.

    DATABASE_URL=postgresql://app@db/shop python examples/07-enqueue-in-transaction/receipt.py

The database is the one `notify-queue migrate` set up; the user needs the role
notify_queue_enqueue (GRANT notify_queue_enqueue TO app) and its own tables' rights. A worker
sends the receipt once the transaction commits; the second order fails, and its receipt with it.
"""

import os
import uuid

import psycopg

from notify_queue.client import enqueue

with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
    conn.execute("CREATE TABLE IF NOT EXISTS shop_orders (id text PRIMARY KEY, total numeric)")
    conn.commit()

    order = f"order-{uuid.uuid4().hex[:8]}"
    with conn.transaction():
        conn.execute("INSERT INTO shop_orders VALUES (%s, 42.50)", [order])
        receipt = enqueue(
            conn,
            idempotency_key=f"{order}-receipt",
            channel="email",
            recipient="ana@example.com",
            subject=f"Your order {order}",
            body="Thank you! Total: 42.50 EUR",
        )
    print(f"committed {order}: receipt {receipt['id']} {receipt['status']}")

    failed = f"order-{uuid.uuid4().hex[:8]}"
    try:
        with conn.transaction():
            conn.execute("INSERT INTO shop_orders VALUES (%s, 10)", [failed])
            enqueue(conn, idempotency_key=f"{failed}-receipt", channel="email",
                    recipient="ana@example.com", body="never sent")  # fmt: skip
            raise RuntimeError("payment declined")
    except RuntimeError as exc:
        print(f"rolled back {failed} ({exc}): no receipt")
