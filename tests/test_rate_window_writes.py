"""How a claim writes its recipients' rate windows (docs/performance.md, step 15).

A recipient without a window gets one by a plain insert; a window the claim read is rewritten by
the ordered upsert. The plain insert is safe because windows are created only by claims, under
the recipient's advisory lock, which the claim's first statement takes before the second reads
the windows. Counted from the WAL (pg_walinspect): no speculative insert's confirmation for new
windows. Shown with the interleaving that matters: a claim waiting for the lock while another
creates the window finds it and adds its place; the negative control creates the window without
the lock, and the claim's insert then fails on the key.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import psycopg
import pytest

from notify_queue.models import ClaimedNotification
from notify_queue.repositories.db import Database
from tests.support import (
    claim_due,
    delivery_service,
    eventually,
    new,
    notification_service,
    waiting_for_lock,
    wal_records,
)

ROWS = 12
INSERTS = ("INSERT", "INSERT+INIT")
# A window as a claim creates it: one entry, taken now.
WINDOW_OF_ONE = (
    "INSERT INTO nq_rate_windows (bucket, recipient, ids, taken, last_taken_at)"
    " SELECT bucket, recipient, ARRAY[gen_random_uuid()], ARRAY[now()], now()"
    " FROM nq_jobs WHERE recipient = %s LIMIT 1"
)


async def _window(database_url: str, recipient: str) -> list[uuid.UUID]:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cur = await conn.execute(
            "SELECT ids FROM nq_rate_windows WHERE recipient = %s", (recipient,)
        )
        rows = await cur.fetchall()
    assert len(rows) == 1, rows
    return list(rows[0][0])


async def test_new_windows_are_plain_inserts_and_known_ones_are_rewritten(
    db: Database, database_url: str
) -> None:
    claimed: list[ClaimedNotification] = []

    def claiming(recipients: list[str]) -> Callable[[], Awaitable[None]]:
        async def claim() -> None:
            await notification_service(db).enqueue_many([new(recipient=r) for r in recipients])
            claimed.extend(await claim_due(db, ROWS))

        return claim

    def fresh() -> list[str]:
        return [f"w{i}-{uuid.uuid4().hex[:8]}@example.com" for i in range(ROWS)]

    # New recipients: a window each, inserted without a confirmation (the upsert: ROWS of them).
    confirmed = await wal_records(database_url, claiming(fresh()), "Heap", "HEAP_CONFIRM")
    assert confirmed.get("nq_rate_windows", 0) == 0
    recipients = fresh()
    inserted = await wal_records(database_url, claiming(recipients), "Heap", INSERTS)
    assert inserted["nq_rate_windows"] == ROWS
    # The same recipients again: each window found and rewritten, none inserted.
    again = await wal_records(database_url, claiming(recipients), "Heap", INSERTS)
    assert again.get("nq_rate_windows", 0) == 0
    for recipient in recipients:
        assert sorted(await _window(database_url, recipient)) == sorted(
            c.id for c in claimed if c.recipient == recipient
        )


async def _claim_while_another_holds_the_lock(
    db: Database, database_url: str, *, lock: bool
) -> tuple[asyncio.Task[object], str]:
    """Another transaction creates `recipient`'s window, holding the recipient's advisory lock
    (as a claim does) when `lock`; this worker's claim of the recipient's notification starts
    meanwhile. Returns the claim (its task) and the recipient."""
    recipient = f"both-{uuid.uuid4().hex[:8]}@example.com"
    await notification_service(db).enqueue_many([new(recipient=recipient)])
    other = await psycopg.AsyncConnection.connect(database_url)
    try:
        if lock:
            await other.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (recipient,)
            )
        await other.execute(WINDOW_OF_ONE, (recipient,))
        claim = asyncio.create_task(delivery_service(db, rate_limit=2).claim(1))
        if lock:
            await eventually(lambda: waiting_for_lock(database_url, "advisory"))
        else:
            # The claim read no window (the other's is not committed) and its insert waits on
            # the other's key.
            await eventually(lambda: waiting_for_lock(database_url, "transactionid"))
        await other.commit()
    finally:
        await other.close()
    return claim, recipient


async def test_a_claim_waiting_for_the_recipient_finds_the_window_created_meanwhile(
    db: Database, database_url: str
) -> None:
    claim, recipient = await _claim_while_another_holds_the_lock(db, database_url, lock=True)
    batch = await claim
    assert len(batch.claimed) == 1  # type: ignore[attr-defined]
    assert len(await _window(database_url, recipient)) == 2


async def test_a_window_created_without_the_lock_makes_the_plain_insert_fail(
    db: Database, database_url: str
) -> None:
    # The negative control: the plain insert relies on every creator of a window holding the
    # recipient's lock. One that does not races the claim's read, and the claim fails on the key.
    claim, recipient = await _claim_while_another_holds_the_lock(db, database_url, lock=False)
    with pytest.raises(psycopg.errors.UniqueViolation, match="nq_rate_windows_pkey"):
        await claim
    assert len(await _window(database_url, recipient)) == 1
