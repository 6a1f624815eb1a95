"""How the API's common batch writes its idempotency keys (migration 0034, docs/performance.md
step 16).

Keys not seen before are inserted plainly, in key order; a key inserted meanwhile by a concurrent
create makes that insert fail, and the function does it again as an upsert in a subtransaction,
with the same answers. Counted from the WAL (pg_walinspect): no speculative insert's confirmation
for new keys. Shown with the interleaving that matters: a create of the same key, uncommitted when
the batch reads the keys and committed while the batch's insert waits for it; the negative control
is a plain insert in that interleaving, which fails on the key.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import psycopg
import pytest

from notify_queue import jsontext
from notify_queue.repositories.db import Database
from notify_queue.repositories.notifications import enqueue_item
from tests.support import eventually, new, notification_service, waiting_for_lock, wal_records

ROWS = 12


async def _one(database_url: str, query: str, params: tuple[object, ...] = ()) -> object:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        return (await (await conn.execute(query, params)).fetchone())[0]  # type: ignore[index]


async def test_new_keys_are_plain_inserts(db: Database, database_url: str) -> None:
    items = [new() for _ in range(ROWS)]

    async def create() -> None:
        results = await notification_service(db).enqueue_many(items)
        assert all(r.created for r in results)

    confirmations = await wal_records(database_url, create, "Heap", "HEAP_CONFIRM")
    assert confirmations.get("nq_idempotency_keys", 0) == 0
    keys = [i.idempotency_key for i in items]
    assert (
        await _one(
            database_url, "SELECT count(*) FROM nq_idempotency_keys WHERE key = ANY(%s)", (keys,)
        )
        == ROWS
    )


async def test_keys_repeated_in_a_batch_or_seen_before_answer_as_before(db: Database) -> None:
    service = notification_service(db)
    before = new(key="seen-" + uuid.uuid4().hex)
    [first] = await service.enqueue_many([before])
    twice = new(key="twice-" + uuid.uuid4().hex)
    other = new(key=twice.idempotency_key, body="another request")
    fresh = new()
    results = await service.enqueue_many([twice, before, other, fresh])
    assert [r.created for r in results] == [True, False, False, True]
    assert results[1].notification.id == first.notification.id and not results[1].conflict
    assert results[2].notification.id == results[0].notification.id
    assert results[2].conflict is (other.request_hash != twice.request_hash)


async def batch_while_the_key_is_created(
    db: Database,
    database_url: str,
    key: str,
    waiting: Callable[[], Awaitable[bool]] | None = None,
) -> list[object]:
    """A batch of ROWS creates, one with `key`, while another transaction creates `key`: not
    committed when the batch reads the keys, committed once the batch waits for it (`waiting`
    says so; by default a backend of the database waiting for another's transaction)."""
    other = await psycopg.AsyncConnection.connect(database_url)
    try:
        # The same key from another API process, with another request (its own create's insert).
        await other.execute(
            "SELECT * FROM nq_enqueue_pending(%s::json, 6, false)",
            (jsontext.dumps_text([enqueue_item(0, new(key=key, body="the other request"))]),),
        )
        items = [new(key=key)] + [new() for _ in range(ROWS - 1)]
        batch = asyncio.create_task(notification_service(db).enqueue_many(items))
        await eventually(waiting or (lambda: waiting_for_lock(database_url, "transactionid")))
        await other.commit()
    finally:
        await other.close()
    return await batch  # type: ignore[return-value]


async def test_a_key_created_meanwhile_is_answered_as_seen_before(
    db: Database, database_url: str
) -> None:
    key = "raced-" + uuid.uuid4().hex
    results = await batch_while_the_key_is_created(db, database_url, key)
    raced, *rest = results
    # The other process's notification answers it (the same request hash: a 200, not a 409).
    assert not raced.created and not raced.conflict  # type: ignore[attr-defined]
    assert raced.notification.body == "the other request"  # type: ignore[attr-defined]
    assert all(r.created for r in rest)  # type: ignore[attr-defined]
    assert (
        await _one(database_url, "SELECT count(*) FROM nq_jobs WHERE idempotency_key = %s", (key,))
        == 1
    )
    assert await _one(database_url, "SELECT count(*) FROM nq_jobs") == ROWS


async def test_without_the_fallback_the_same_interleaving_fails_on_the_key(
    database_url: str,
) -> None:
    # The negative control: the plain insert alone, after reading the key as not seen.
    key = "raced-" + uuid.uuid4().hex
    other = await psycopg.AsyncConnection.connect(database_url)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as mine:
        try:
            await other.execute(
                "INSERT INTO nq_idempotency_keys (key, notification_id, request_hash)"
                " VALUES (%s, gen_random_uuid(), 'h-other')",
                (key,),
            )
            seen = await mine.execute(
                "SELECT count(*) FROM nq_idempotency_keys WHERE key = %s", (key,)
            )
            assert (await seen.fetchone())[0] == 0  # type: ignore[index]
            insert = asyncio.create_task(
                mine.execute(
                    "INSERT INTO nq_idempotency_keys (key, notification_id, request_hash)"
                    " VALUES (%s, gen_random_uuid(), 'h-mine')",
                    (key,),
                )
            )
            await eventually(lambda: waiting_for_lock(database_url, "transactionid"))
            await other.commit()
        finally:
            await other.close()
        with pytest.raises(psycopg.errors.UniqueViolation):
            await insert
