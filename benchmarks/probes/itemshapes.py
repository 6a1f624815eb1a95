"""What the server pays to read a batch enqueue's items, per item, by the shape they are written
in (docs/performance.md, "NULL fields left out, and what the worker sends as NULL").

    python -m benchmarks.probes.itemshapes [--items N] [--repeat R]

N plain items as the cost scenario sends them (an email with a subject and a 120-character body),
made by the product's own `enqueue_item` and written by its JSON writer, in two shapes: every
field named, NULL ones as `null` (how they were written before), and NULL fields left out (how
they are written now; the server reads a missing field as NULL). Each is read on an embedded
PostgreSQL by `json_to_recordset` with nq_enqueue_pending's column list, counted and nothing
else: the best of R round trips, in µs per item (the payload's trip through the socket
included, the same for both but for the bytes left out). Writes
`benchmarks/results/itemshapes/<timestamp>.json`.
"""

from __future__ import annotations

import argparse
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from benchmarks import alternating
from benchmarks.env import fresh_postgres
from notify_queue import jsontext
from notify_queue.models import Channel, NewNotification, Priority
from notify_queue.repositories.notifications import enqueue_item

RESULTS = Path(__file__).parent.parent / "results" / "itemshapes"

# nq_enqueue_pending's column list (0034), the fields an item may carry.
_COLUMNS = (
    "id uuid, idempotency_key text, request_hash text, channel text, recipient text, "
    "subject text, body text, priority smallint, send_at timestamptz, expires_at timestamptz, "
    "source text, policy text, webhook_url text, metadata jsonb, category text, "
    "recipient_id text, template_name text, template_version integer, traceparent text, "
    "position bigint"
)
_FIELDS = [c.split()[0] for c in _COLUMNS.split(", ")]


def _items(count: int) -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    return [
        enqueue_item(
            position,
            NewNotification(
                idempotency_key=uuid.uuid4().hex,
                request_hash=uuid.uuid4().hex * 2,
                channel=Channel.EMAIL,
                recipient=f"{uuid.uuid4().hex}@example.com",
                subject="Your receipt",
                body="x" * 120,
                priority=Priority.NORMAL,
                send_at=now,
            ),
        )
        for position in range(count)
    ]


def measure(url: str, count: int, repeat: int) -> dict[str, float]:
    items = _items(count)
    shapes = {
        "every field, NULL ones as null": [{f: item.get(f) for f in _FIELDS} for item in items],
        "NULL fields left out": items,
    }
    query = f"SELECT count(*) FROM json_to_recordset(%s::json) AS r({_COLUMNS})"
    figures = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for name, shape in shapes.items():
            payload = jsontext.dumps_text(shape)
            best = float("inf")
            for _ in range(repeat):
                started = time.perf_counter()
                (counted,) = conn.execute(query, (payload,), prepare=True).fetchone() or (0,)
                best = min(best, time.perf_counter() - started)
            assert counted == count
            figures[name] = round(best / count * 1e6, 3)
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=100)
    ap.add_argument("--output-dir", type=Path, default=RESULTS)
    args = ap.parse_args()
    with fresh_postgres("itemshapes") as pg:
        figures = measure(pg.url(), args.items, args.repeat)
    for name, us in figures.items():
        print(f"{us:8.3f} us per item  {name}")
    params = {"items": args.items, "repeat": args.repeat}
    alternating.write(args.output_dir, {"params": params, "us_per_item": figures})


if __name__ == "__main__":
    main()
