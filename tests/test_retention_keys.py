"""Idempotency keys across retention (issue 19, migration 0011): a retry racing the retention run
of its notification's partition never leaves a live notification without its key.

The two are interleaved deterministically on two connections: one holds its transaction open at
the step that matters, the other is started and observed waiting on a lock (pg_stat_activity),
then the first commits. Either order ends with one notification for the key: the retried one,
which keeps its key (a create with it answers 200), or none, when retention forgot the key first
and the retry is refused (a create then makes the only one). No sleeps decide the order.

Negative control (by hand, with 0008's two functions instead of 0011's): retry first, the key
is forgotten under the uncommitted retry (the run does not wait for it until its detach) and the
create makes a second notification; forget first, the retry does not wait and moves the row back
without its key, and the create makes a second notification. Both tests fail.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable
from datetime import timedelta
from typing import Any

import psycopg
import psycopg.sql
import pytest

from notify_queue.errors import Conflict
from notify_queue.models import Status
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery_log import DeliveryLogRepository
from notify_queue.services.retention import DeliveryLogKeeper
from tests.support import new, notification_service, set_status_sql

KEY = "order-1001-receipt"


async def dead_letter_past_the_retention(db: Database, database_url: str) -> tuple[uuid.UUID, str]:
    """A notification created with KEY, dead-lettered 40 days ago, alone in the one partition
    retention will drop (the fresh database's older ones are dropped first, so nothing else in
    the run, a detach of an earlier partition, say, serialises it with the retry by chance).
    Returns its id and its partition."""
    await DeliveryLogKeeper(DeliveryLogRepository(db), retention_days=30).maintain()
    created = await notification_service(db).enqueue(new(key=KEY))
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT (now() AT TIME ZONE 'UTC')::date - 40,"
            " 'nq_delivery_log_' || to_char((now() AT TIME ZONE 'UTC')::date - 40, 'YYYYMMDD')"
        )
        (day, partition) = await cur.fetchone() or (None, "")
        await conn.execute(
            psycopg.sql.SQL(
                "CREATE TABLE {p} (LIKE nq_delivery_log INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
            ).format(p=psycopg.sql.Identifier(partition))
        )
        await conn.execute(
            psycopg.sql.SQL(
                "ALTER TABLE nq_delivery_log ATTACH PARTITION {p} FOR VALUES FROM ({a}) TO ({b})"
            ).format(
                p=psycopg.sql.Identifier(partition),
                a=psycopg.sql.Literal(f"{day} 00:00Z"),
                b=psycopg.sql.Literal(f"{day + timedelta(days=1)} 00:00Z"),
            )
        )
        await conn.execute("UPDATE nq_jobs SET finished_at = %s::timestamptz", [f"{day} 12:00Z"])
        await conn.execute(set_status_sql("true"), {"status": "DEAD_LETTERED"})
        cur = await conn.execute("SELECT tableoid::regclass::text FROM nq_delivery_log")
        assert await cur.fetchall() == [(partition,)]
    return created.notification.id, partition


async def waiting_on_a_lock(database_url: str, other: Awaitable[Any]) -> bool:
    """Wait until another session waits on a lock (True), or `other` ends first (False: nothing
    made it wait, as with the unfixed functions). A generous deadline, never a timing claim."""
    task = asyncio.ensure_future(other)
    deadline = time.monotonic() + 60
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        while not task.done():
            cur = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            (waiting,) = await cur.fetchone() or (0,)
            if waiting:
                return True
            assert time.monotonic() < deadline, "neither waiting nor done"
            await asyncio.sleep(0.02)
    return False


async def notifications_with_key(database_url: str) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT id, status FROM nq_all_notifications WHERE idempotency_key = %s", [KEY]
        )
        return await cur.fetchall()


async def key_owner(database_url: str) -> uuid.UUID | None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT notification_id FROM nq_idempotency_keys WHERE key = %s", [KEY]
        )
        row = await cur.fetchone()
        return row[0] if row else None


async def test_a_retry_that_locks_the_row_first_keeps_its_key_through_the_retention_run(
    db: Database, database_url: str
) -> None:
    id, partition = await dead_letter_past_the_retention(db, database_url)
    keeper = DeliveryLogKeeper(DeliveryLogRepository(db), retention_days=30)
    async with await psycopg.AsyncConnection.connect(database_url) as retry:
        # The retry's statement (what POST /notifications/{id}/retry runs), not yet committed.
        cur = await retry.execute("SELECT nq_retry(%s)", [[id]])
        assert await cur.fetchall() == [(id,)]
        run = asyncio.ensure_future(keeper.maintain())
        assert await waiting_on_a_lock(database_url, asyncio.shield(run))
        await retry.commit()
    dropped = await run
    assert partition in {d.partition for d in dropped}  # the run went through with its drop

    assert await key_owner(database_url) == id
    assert await notifications_with_key(database_url) == [(id, "PENDING")]
    again = await notification_service(db).enqueue(new(key=KEY))
    assert (again.created, again.conflict, again.notification.id) == (False, False, id)
    assert len(await notifications_with_key(database_url)) == 1


async def test_a_retry_after_the_key_was_forgotten_is_refused_and_the_key_makes_one_notification(
    db: Database, database_url: str
) -> None:
    id, partition = await dead_letter_past_the_retention(db, database_url)
    service = notification_service(db)
    async with await psycopg.AsyncConnection.connect(database_url) as forget:
        # Retention's first chunk of the partition (what the run does first), not yet committed.
        await forget.execute(
            "SELECT nq_delivery_log_forget_keys(%s, %s, 10000)", [partition, uuid.UUID(int=0)]
        )
        retried = asyncio.ensure_future(service.retry(id))
        assert await waiting_on_a_lock(database_url, asyncio.shield(retried))
        await forget.commit()
    with pytest.raises(Conflict, match="past the retention"):
        await retried

    assert await key_owner(database_url) is None
    assert await notifications_with_key(database_url) == [(id, "DEAD_LETTERED")]
    keeper = DeliveryLogKeeper(DeliveryLogRepository(db), retention_days=30)
    assert partition in {d.partition for d in await keeper.maintain()}
    # The notification is gone with its partition: the key is free, and makes exactly one.
    again = await notification_service(db).enqueue(new(key=KEY))
    assert again.created and again.notification.id != id
    assert await notifications_with_key(database_url) == [(again.notification.id, "PENDING")]


async def test_the_batch_retry_skips_rows_whose_key_was_forgotten(
    db: Database, database_url: str
) -> None:
    """A partition whose run stopped after forgetting its keys (the next run finishes it): its
    rows are refused, and the batch retry does not pick them, so they cannot fill its batches."""
    id, partition = await dead_letter_past_the_retention(db, database_url)
    younger = (await notification_service(db).enqueue(new(key="younger"))).notification.id
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(
            set_status_sql("id = %(id)s"), {"status": "DEAD_LETTERED", "id": younger}
        )
        await conn.execute(
            "SELECT nq_delivery_log_forget_keys(%s, %s, 10000)", [partition, uuid.UUID(int=0)]
        )
    retried, _ = await notification_service(db).retry_batch(status=Status.DEAD_LETTERED, limit=1)
    assert retried == 1
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT id FROM nq_jobs")
        assert await cur.fetchall() == [(younger,)]
    with pytest.raises(Conflict, match="past the retention"):
        await notification_service(db).retry(id)


async def test_the_forget_locks_only_the_rows_a_retry_could_move(
    db: Database, database_url: str
) -> None:
    """0038: a retry moves only FAILED and DEAD_LETTERED rows back, so only those are locked
    before their keys are forgotten; a SENT row's key goes without a lock (0011 locked every row
    of the chunk, a heap lock record each, in a partition about to be dropped). The chunk is held
    open in one transaction while another session asks for each row's lock without waiting: the
    DEAD_LETTERED row's is refused, the SENT row's is granted. Both keys are forgotten.
    Negative control (by hand, 0011's function without 0038): the SENT row's lock is refused too,
    and the test fails."""
    await DeliveryLogKeeper(DeliveryLogRepository(db), retention_days=30).maintain()
    service = notification_service(db)
    sent = (await service.enqueue(new(key="k-sent"))).notification.id
    dead = (await service.enqueue(new(key="k-dead"))).notification.id
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        for id, status in ((sent, "SENT"), (dead, "DEAD_LETTERED")):
            await conn.execute(set_status_sql("id = %(id)s"), {"id": id, "status": status})
        cur = await conn.execute("SELECT DISTINCT tableoid::regclass::text FROM nq_delivery_log")
        ((partition,),) = await cur.fetchall()

    async with (
        await psycopg.AsyncConnection.connect(database_url) as forgetting,
        await psycopg.AsyncConnection.connect(database_url, autocommit=True) as other,
    ):
        await forgetting.execute(
            "SELECT nq_delivery_log_forget_keys(%s, %s, 100)", [partition, uuid.UUID(int=0)]
        )  # its transaction stays open: its row locks are held

        async def lockable(id: uuid.UUID) -> bool:
            try:
                await other.execute(
                    "SELECT id FROM nq_delivery_log WHERE id = %s FOR UPDATE NOWAIT", [id]
                )
            except psycopg.errors.LockNotAvailable:
                return False
            return True

        assert not await lockable(dead)
        assert await lockable(sent)
        await forgetting.commit()
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM nq_idempotency_keys WHERE key IN ('k-sent', 'k-dead')"
        )
        assert await cur.fetchone() == (0,)
