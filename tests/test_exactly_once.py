"""Exactly-once delivery under concurrency: SKIP LOCKED claims, claim tokens, leases.

The spec's three tests (one notification raced by ten workers, 300 notifications through ten
workers, and the control without SKIP LOCKED that shows why it is needed), plus stale tokens,
lease expiry and the cancel-versus-claim race.
"""

from __future__ import annotations

import asyncio
import uuid

import psycopg

from notify_queue.models import DeliveryResult, Outcome, Status
from notify_queue.providers.simulated import SimulatedProvider
from notify_queue.repositories.db import Database
from tests.support import (
    delivery_service,
    eventually,
    new,
    notification_service,
    start_workers,
    status_counts,
)


async def _pools(database_url: str, n: int) -> list[Database]:
    pools = [Database(database_url, pool_size=1) for _ in range(n)]
    await asyncio.gather(*(p.open() for p in pools))
    return pools


async def test_ten_workers_racing_for_one_notification_leave_exactly_one_winner_each_time(
    db: Database, database_url: str
) -> None:
    pools = await _pools(database_url, 10)
    try:
        services = [delivery_service(p) for p in pools]
        for _ in range(25):
            created = await notification_service(db).enqueue(new())
            batches = await asyncio.gather(*(s.claim(10) for s in services))
            winners = [b.claimed[0].id for b in batches if b.claimed]
            assert winners == [created.notification.id]
    finally:
        await asyncio.gather(*(p.close() for p in pools))


async def test_three_hundred_notifications_through_ten_workers_reach_the_provider_exactly_300_times(
    db: Database, database_url: str
) -> None:
    await notification_service(db).enqueue_many([new() for _ in range(300)])
    provider = SimulatedProvider(0.0, 1.0, 1.0)
    workers = await start_workers(database_url, provider, count=10, batch_size=7, concurrency=8)
    try:
        await eventually(lambda: _all_sent(db, 300), timeout=30)
    finally:
        await workers.stop()
    assert provider.calls == 300
    assert provider.deliveries == 300 and provider.repeats == 0


async def _all_sent(db: Database, n: int) -> bool:
    return (await status_counts(db)).get("SENT", 0) == n


async def test_without_skip_locked_a_naive_claim_hands_one_notification_to_several_workers(
    db: Database, database_url: str
) -> None:
    """The control: read the first due row, then mark it taken, with no lock between the two."""
    naive_select = "SELECT id FROM nq_jobs WHERE status = 'PENDING' ORDER BY created_at LIMIT 1"
    naive_update = "UPDATE nq_jobs SET status = 'PROCESSING' WHERE id = %s"
    duplicates = 0
    for _ in range(10):
        await notification_service(db).enqueue(new())
        conns = [
            await psycopg.AsyncConnection.connect(database_url, autocommit=True) for _ in range(10)
        ]
        try:
            picked = await asyncio.gather(*(c.execute(naive_select) for c in conns))
            ids = [row[0] for cur in picked if (row := await cur.fetchone())]
            await asyncio.gather(
                *(c.execute(naive_update, (i,)) for c, i in zip(conns, ids, strict=False))
            )
            duplicates += len(ids) - len(set(ids))
        finally:
            for c in conns:
                await c.close()
    assert duplicates > 0


async def test_a_result_from_a_stale_claim_token_is_rejected_and_the_newer_one_stands(
    db: Database,
) -> None:
    created = await notification_service(db).enqueue(new())
    slow = delivery_service(db, lease_seconds=0.2)
    fast = delivery_service(db)
    first = (await slow.claim(1)).claimed[0]
    await asyncio.sleep(0.3)
    await slow.housekeeping()  # the lease ran out: back to PENDING
    second = (await fast.claim(1)).claimed[0]
    assert second.id == first.id and second.claim_token != first.claim_token
    assert second.attempt_count == 2

    _, recorded = await fast.complete(
        [(second, DeliveryResult(Outcome.SENT, provider_message_id="new"))]
    )
    assert recorded.accepted == {second.id}
    _, recorded_late = await slow.complete(
        [(first, DeliveryResult(Outcome.PERMANENT_FAILURE, error="late"))]
    )
    assert recorded_late.accepted == set()
    stored = await notification_service(db).get(created.notification.id)
    assert stored.status is Status.SENT and stored.provider_message_id == "new"


async def test_an_expired_lease_is_redelivered_with_the_same_idempotency_key(
    db: Database, database_url: str
) -> None:
    created = await notification_service(db).enqueue(new())
    crashed = delivery_service(db, lease_seconds=0.2)
    claimed = (await crashed.claim(1)).claimed[0]
    provider = SimulatedProvider(0.0, 0.0, 1.0)
    # The crashed worker had delivered before dying: the provider knows the key already.
    from notify_queue.providers.base import DeliveryRequest

    await provider.deliver(
        DeliveryRequest(claimed.id, claimed.channel, claimed.recipient, None, "hello")
    )
    workers = await start_workers(database_url, provider)
    try:
        stored = await eventually(lambda: _sent(db, created.notification.id), timeout=10)
    finally:
        await workers.stop()
    assert stored.attempt_count == 2
    assert provider.deliveries == 1 and provider.repeats == 1


async def _sent(db: Database, id: uuid.UUID) -> object:
    n = await notification_service(db).get(id)
    return n if n.status is Status.SENT else None


async def test_cancel_and_claim_racing_have_exactly_one_winner(
    db: Database, database_url: str
) -> None:
    pools = await _pools(database_url, 2)
    try:
        claimer = delivery_service(pools[0])
        canceller = notification_service(pools[1])
        outcomes = {"claimed": 0, "cancelled": 0}
        for _ in range(30):
            created = await notification_service(db).enqueue(new())
            claim, cancel = await asyncio.gather(
                claimer.claim(1), canceller.cancel(created.notification.id), return_exceptions=True
            )
            claimed = not isinstance(claim, BaseException) and bool(claim.claimed)
            cancelled = not isinstance(cancel, BaseException)
            assert claimed != cancelled, (claim, cancel)
            outcomes["claimed" if claimed else "cancelled"] += 1
            stored = await notification_service(db).get(created.notification.id)
            assert stored.status is (Status.PROCESSING if claimed else Status.CANCELLED)
    finally:
        await asyncio.gather(*(p.close() for p in pools))
