"""The completion takes no row lock; its writes name the claim (functions/nq_finish_held.sql,
docs/performance.md "The drain's CPU, step by step", step 13).

A result is recorded only while its row is PROCESSING under the result's claim token. The
completion used to lock its rows first (a WAL record per row); now the move into the log
(nq_finish_held's DELETE) and a retry's UPDATE carry the token in their condition, and a row whose
claim moved on while the completion waited for it is re-read and left alone. Counted from the WAL
(pg_walinspect) with a FOR UPDATE of the same rows as the negative control, and the race shown with
the interleaving that makes it: a recovery and new claim of the row, uncommitted while the late
result arrives, committed while the completion waits; without the token (the negative control)
the same interleaving moves the other worker's row. A digest's carrier, the one row still locked
(before its items), is checked again on the version it locked: a late carrier result ends no item
(without that check in `carriers` the items leave the queue: tried by hand when this was written).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Collection
from typing import TypeVar

import psycopg

from notify_queue.models import ClaimedNotification, Completion, DigestSpec, Status
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery import DeliveryRepository
from tests.support import (
    claim_due,
    claim_new,
    defaults,
    eventually,
    new,
    notification_service,
    wal_records,
)

ROWS = 12
T = TypeVar("T")


def _results(
    claimed: Collection[ClaimedNotification], retried: Collection[uuid.UUID]
) -> list[Completion]:
    """SENT for each row, or a temporary failure (PENDING, retried in an hour) for `retried`."""
    return [
        Completion(c.id, c.claim_token, Status.PENDING, 3600.0, "busy", None, "log")
        if c.id in retried
        else Completion(c.id, c.claim_token, Status.SENT, None, None, f"m-{c.id}", "log")
        for c in claimed
    ]


async def test_a_completion_locks_no_row(database_url: str) -> None:
    async with Database(database_url, pool_size=1, name="notify-queue-worker") as db:
        claimed = await claim_new(db, ROWS)
        retried = {c.id for c in claimed[::3]}

        async def complete() -> None:
            recorded = await DeliveryRepository(db, defaults(rate_limit=1_000)).deliveries_complete(
                completions=_results(claimed, retried)
            )
            assert recorded.accepted == {c.id for c in claimed}

        locks = await wal_records(database_url, complete, "Heap", "LOCK")
    assert locks.get("nq_jobs", 0) == 0
    assert await _where(database_url, claimed) == {
        c.id: ("PENDING" if c.id in retried else "SENT") for c in claimed
    }


async def test_the_lock_the_completion_no_longer_takes_is_a_record_per_row(
    database_url: str,
) -> None:
    # The negative control: the WAL count sees a row lock, one record per row.
    async with Database(database_url, pool_size=1, name="notify-queue-worker") as db:
        claimed = await claim_new(db, ROWS)

    async def lock() -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            await conn.execute(
                "SELECT id FROM nq_jobs WHERE id = ANY(%s) ORDER BY id FOR UPDATE",
                ([c.id for c in claimed],),
            )
            await conn.commit()

    assert (await wal_records(database_url, lock, "Heap", "LOCK"))["nq_jobs"] == ROWS


async def _where(
    database_url: str, claimed: Collection[ClaimedNotification]
) -> dict[uuid.UUID, str]:
    """Each row's status, from the log for a finished one."""
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cur = await conn.execute(
            "SELECT id, status FROM nq_jobs WHERE id = ANY(%(ids)s)"
            " UNION ALL SELECT id, status FROM nq_delivery_log WHERE id = ANY(%(ids)s)",
            {"ids": [c.id for c in claimed]},
        )
        return {r[0]: r[1] for r in await cur.fetchall()}


CLAIMED_AGAIN = (
    "UPDATE nq_jobs SET claim_token = %s, lease_expires_at = now() + interval '5 minutes',"
    " attempt_count = attempt_count + 1 WHERE id = ANY(%s)"
)
WAITING_FOR_A_ROW = (
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database()"
    " AND wait_event_type = 'Lock' AND wait_event = 'transactionid'"
)


async def _late_while_claimed_again(
    database_url: str, claimed: Collection[ClaimedNotification], late: Awaitable[T]
) -> tuple[T, uuid.UUID]:
    """The interleaving: the rows' leases recovered and the rows claimed again by another worker
    (the new token is returned), not yet committed when the late result (`late`) reaches them,
    committed once it waits for them."""
    again = uuid.uuid4()
    async with await psycopg.AsyncConnection.connect(database_url) as other:
        await other.execute(CLAIMED_AGAIN, (again, [c.id for c in claimed]))
        task = asyncio.ensure_future(late)
        try:
            async with await psycopg.AsyncConnection.connect(
                database_url, autocommit=True
            ) as observer:

                async def waiting() -> bool:
                    row = await (await observer.execute(WAITING_FOR_A_ROW)).fetchone()
                    return row is not None and row[0] > 0

                await eventually(waiting, what="the late result waiting for the rows")
            await other.commit()
            return await task, again
        finally:
            task.cancel()


async def test_a_late_result_whose_rows_are_claimed_again_meanwhile_changes_nothing(
    database_url: str,
) -> None:
    async with Database(database_url, pool_size=1, name="notify-queue-worker") as db:
        claimed = await claim_new(db, 4)
        retried = {claimed[0].id}
        late = DeliveryRepository(db, defaults(rate_limit=1_000)).deliveries_complete(
            completions=_results(claimed, retried)
        )
        recorded, again = await _late_while_claimed_again(database_url, claimed, late)
    assert recorded.accepted == set()
    assert await _where(database_url, claimed) == {c.id: "PROCESSING" for c in claimed}
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cur = await conn.execute(
            "SELECT DISTINCT claim_token, attempt_count, last_error FROM nq_jobs"
            " WHERE id = ANY(%s)",
            ([c.id for c in claimed],),
        )
        assert await cur.fetchall() == [(again, 2, None)]


async def test_without_the_token_the_same_interleaving_moves_the_other_workers_rows(
    database_url: str,
) -> None:
    # The negative control: the same move without the claim's token in its condition.
    async with Database(database_url, pool_size=1, name="notify-queue-worker") as db:
        claimed = await claim_new(db, 4)

    async def move_without_the_token() -> int:
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM nq_finish_held(%s, NULL, %s,"
                " NULL, NULL, NULL, NULL, NULL, NULL)",
                ([c.id for c in claimed], ["SENT"] * len(claimed)),
            )
            moved = await cur.fetchone()
            await conn.commit()
            return int(moved[0])  # type: ignore[index]

    moved, _ = await _late_while_claimed_again(database_url, claimed, move_without_the_token())
    assert moved == len(claimed)
    assert await _where(database_url, claimed) == {c.id: "SENT" for c in claimed}


async def test_a_late_result_of_a_digests_carrier_claimed_again_meanwhile_ends_no_item(
    database_url: str,
) -> None:
    # The one row the completion still locks: a digest's carrier, so its items end only with a
    # result whose claim holds (docs/digests.md); checked again on the version it locked.
    async with Database(database_url, pool_size=2, name="notify-queue-worker") as db:
        recipient = f"dee-{uuid.uuid4().hex[:6]}@example.com"
        made = await notification_service(db, announce=False).enqueue_many(
            [
                dataclasses.replace(
                    new(recipient=recipient, body=str(i)),
                    digest=DigestSpec(key="likes", window_seconds=86_400, max_items=3),
                )
                for i in range(3)
            ]
        )
        (carrier,) = await claim_due(db, 1)
        assert carrier.digest_id is not None
        late = DeliveryRepository(db, defaults(rate_limit=1_000)).deliveries_complete(
            completions=_results([carrier], retried=())
        )
        recorded, _ = await _late_while_claimed_again(database_url, [carrier], late)
    assert recorded.accepted == set()
    items = {r.notification.id for r in made} - {carrier.id}
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cur = await conn.execute(
            "SELECT id, status FROM nq_jobs WHERE id = ANY(%s)", ([*items, carrier.id],)
        )
        found = dict(await cur.fetchall())
    assert found == {**dict.fromkeys(items, "PENDING"), carrier.id: "PROCESSING"}
