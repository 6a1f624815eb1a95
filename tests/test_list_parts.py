"""The list (GET /notifications) reads four parts and merges them (migrations 0026-0029,
docs/performance.md "The drain's CPU, step by step", steps 11 and 12).

The queue keeps the (created_at, id) order for its PENDING rows only (nq_jobs_pending_created),
so a claim, which turns a row PROCESSING, writes no entry there; the log keeps its status index
for the rows not SENT (nq_delivery_log_unsent), so a sent row's completion writes none there.
Counted from the WAL (pg_walinspect), with an index of the same key without the predicate beside
each as the negative control, which takes an entry for every row. The list finds the rows in
flight through the lease index and lists of SENT rows through the log's (created_at, id) index,
and pages through waiting, claimed and finished rows in one order; a plan kept for the statement
(a generic plan) never reads a part the status filter excludes, which it does when a part's
status conditions mention the row (the negative control).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import psycopg
import pytest

from notify_queue.models import Channel, Priority, Status
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery import DeliveryRepository
from notify_queue.repositories.notifications import NotificationRepository
from notify_queue.repositories.queries import QUERIES
from tests.support import (
    claim_due,
    claim_new,
    defaults,
    finish,
    new,
    notification_service,
    statistics_count,
    wal_records,
)

ROWS = 16


async def _in_every_part(db: Database) -> dict[Status, set[uuid.UUID]]:
    """ROWS notifications created one after another, every other one HIGH; the HIGH ones claimed
    (so claimed rows lie between waiting ones in created order), half of those finished."""
    service = notification_service(db, announce=False)
    for i in range(ROWS):
        await service.enqueue_many([new(priority=Priority.HIGH if i % 2 else Priority.NORMAL)])
    repository = DeliveryRepository(db, defaults(rate_limit=1_000))
    claimed = (
        await repository.notifications_claim(
            priorities=[Priority.HIGH], channels=list(Channel), limit=ROWS
        )
    ).claimed
    assert len(claimed) == ROWS // 2
    finishing = claimed[: ROWS // 4]
    await finish(db, finishing, failed={c.id for c in finishing[::2]})
    parts: dict[Status, set[uuid.UUID]] = {s: set() for s in Status}
    parts[Status.FAILED] = {c.id for c in finishing[::2]}
    parts[Status.SENT] = {c.id for c in finishing[1::2]}
    parts[Status.PROCESSING] = {c.id for c in claimed[ROWS // 4 :]}
    return parts


async def _page_through(
    repository: NotificationRepository, status: Status | None, limit: int
) -> list[tuple[datetime, uuid.UUID, Status]]:
    seen: list[tuple[datetime, uuid.UUID, Status]] = []
    after: tuple[datetime, uuid.UUID] | None = None
    while True:
        page = await repository.notifications_list(
            status=status, channel=None, recipient=None, after=after, limit=limit
        )
        seen += [(n.created_at, n.id, n.status) for n in page]
        if len(page) < limit:
            return seen
        after = (page[-1].created_at, page[-1].id)


async def test_a_list_pages_through_waiting_claimed_and_finished_rows_in_one_order(
    db: Database,
) -> None:
    parts = await _in_every_part(db)
    repository = NotificationRepository(db)
    everything = await _page_through(repository, None, limit=3)
    assert len(everything) == ROWS
    assert [(t, i) for t, i, _ in everything] == sorted((t, i) for t, i, _ in everything)
    assert {s for _, _, s in everything} == {
        Status.PENDING,
        Status.PROCESSING,
        Status.SENT,
        Status.FAILED,
    }
    for status in (Status.PROCESSING, Status.SENT, Status.FAILED):
        assert {i for _, i, _ in await _page_through(repository, status, limit=2)} == parts[status]
    pending = await _page_through(repository, Status.PENDING, limit=2)
    assert len(pending) == ROWS // 2 and {s for _, _, s in pending} == {Status.PENDING}
    assert await _page_through(repository, Status.CANCELLED, limit=2) == []


async def _create_index(database_url: str, statement: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(statement)  # type: ignore[arg-type]


async def test_a_claim_writes_no_entry_in_the_queues_order(database_url: str) -> None:
    # The negative control: an index of the same key without the predicate.
    await _create_index(
        database_url, "CREATE INDEX nq_jobs_every_created ON nq_jobs (created_at, id)"
    )
    async with Database(database_url, pool_size=1, name="notify-queue-worker") as db:
        await notification_service(db, announce=False).enqueue_many([new() for _ in range(ROWS)])

        async def claim() -> None:
            await claim_due(db, ROWS)

        entries = await wal_records(database_url, claim, "Btree", "INSERT_LEAF")
    assert entries.get("nq_jobs_pending_created", 0) == 0
    assert entries["nq_jobs_every_created"] == ROWS
    assert entries["nq_jobs_lease"] == ROWS


async def test_a_sent_rows_completion_writes_no_entry_in_the_logs_status_index(
    database_url: str,
) -> None:
    # The negative control: the status index 0029 dropped, every row in it.
    await _create_index(
        database_url,
        "CREATE INDEX nq_delivery_log_every_status ON nq_delivery_log (status, created_at, id)",
    )
    async with Database(database_url, pool_size=1, name="notify-queue-worker") as db:
        claimed = await claim_new(db, ROWS)

        async def complete() -> None:
            await finish(db, claimed, failed={c.id for c in claimed[::4]})

        entries = await wal_records(database_url, complete, "Btree", "INSERT_LEAF")
    assert entries["nq_delivery_log_unsent"] == ROWS // 4
    assert entries["nq_delivery_log_every_status"] == ROWS
    assert entries["nq_delivery_log_created"] == ROWS


LOG_INDEX_READS = (
    "SELECT COALESCE(sum(idx_tup_read), 0) FROM pg_stat_user_indexes"
    " WHERE relname LIKE 'nq_delivery_log%'"
)


async def _log_reads_of_a_kept_plan_listing_pending(database_url: str) -> int:
    """Log index entries read by seven lists of PENDING rows on one connection whose plans are
    generic (the fifth run on a connection prepares the statement)."""
    async with Database(database_url, pool_size=1) as db:
        await _in_every_part(db)
        async with db.connection() as conn:
            raw: Any = conn._conn
            await raw.execute("SET plan_cache_mode = force_generic_plan")
        before = await statistics_count(db, database_url, LOG_INDEX_READS)
        repository = NotificationRepository(db)
        for _ in range(7):
            listed = await repository.notifications_list(
                status=Status.PENDING, channel=None, recipient=None, after=None, limit=50
            )
            assert len(listed) == ROWS // 2
        async with db.connection() as conn:
            raw = conn._conn
            cur = await raw.execute(
                "SELECT generic_plans FROM pg_prepared_statements"
                " WHERE statement LIKE '%ORDER BY n.created_at, n.id%'"
            )
            generic = [r["generic_plans"] for r in await cur.fetchall()]
            assert len(generic) == 1 and generic[0] >= 1, generic
        return await statistics_count(db, database_url, LOG_INDEX_READS) - before


async def test_a_kept_plan_never_reads_a_part_the_status_excludes(database_url: str) -> None:
    assert await _log_reads_of_a_kept_plan_listing_pending(database_url) == 0


async def test_with_the_status_checked_per_row_a_kept_plan_reads_the_log(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The negative control: the finished part's status conditions as one, which mentions the
    # row, so a generic plan cannot drop the part before reading it.
    one_time = (
        "WHERE (%(status)s::text IS NULL OR %(status)s::text = 'SENT')\n"
        "       AND (%(status)s::text IS NULL OR n.status = 'SENT')"
    )
    per_row = (
        "WHERE (%(status)s::text IS NULL OR (%(status)s::text = 'SENT' AND n.status = 'SENT'))"
    )
    assert one_time in QUERIES["notification_list"]
    monkeypatch.setitem(
        QUERIES, "notification_list", QUERIES["notification_list"].replace(one_time, per_row)
    )
    assert await _log_reads_of_a_kept_plan_listing_pending(database_url) > 0
