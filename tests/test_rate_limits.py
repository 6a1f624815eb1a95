"""Per-recipient rolling-window rate limits, counted in the database."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from notify_queue.models import DeliveryResult, Outcome, Policy, Priority, Status
from notify_queue.repositories.db import Database
from notify_queue.repositories.policies import PolicyRepository
from tests.support import delivery_service, new, notification_service

SENT = DeliveryResult(Outcome.SENT)


async def test_notifications_over_the_limit_wait_without_using_an_attempt(db: Database) -> None:
    service = notification_service(db)
    created = await service.enqueue_many([new(recipient="busy@example.com") for _ in range(4)])
    delivery = delivery_service(db, rate_limit=3)
    batch = await delivery.claim(10)
    assert len(batch.claimed) == 3 and len(batch.rate_limited) == 1
    waiting = [await service.get(c.notification.id) for c in created]
    deferred = [n for n in waiting if n.status is Status.PENDING]
    assert len(deferred) == 1 and deferred[0].attempt_count == 0
    # It is due when the oldest slot frees: one window (an hour) after that slot was taken.
    assert deferred[0].next_attempt_at > datetime.now(UTC) + timedelta(seconds=3500)


async def test_a_limited_notification_is_due_the_moment_its_slot_frees(db: Database) -> None:
    service = notification_service(db)
    delivery = delivery_service(db, rate_limit=2, rate_window_seconds=1.0)
    first = await service.enqueue_many([new(recipient="r@example.com") for _ in range(2)])
    # The slots are taken by this claim: bracketed by the clock around it, however slow it is.
    claiming = datetime.now(UTC)
    batch = await delivery.claim(10)
    claimed = datetime.now(UTC)
    await delivery.complete([(c, SENT) for c in batch.claimed])
    late = await service.enqueue(new(recipient="r@example.com"))
    limited = await delivery.claim(10)
    assert limited.claimed == [] and len(limited.rate_limited) == 1
    stored = await service.get(late.notification.id)
    window = timedelta(seconds=1)
    assert claiming + window <= stored.next_attempt_at <= claimed + window, stored.next_attempt_at
    await asyncio.sleep(max((stored.next_attempt_at - datetime.now(UTC)).total_seconds(), 0) + 0.05)
    again = await delivery.claim(10)
    assert [c.id for c in again.claimed] == [late.notification.id]
    assert again.claimed[0].attempt_count == 1
    assert len(first) == 2


async def test_two_workers_checking_one_recipient_cannot_both_take_the_last_slot(
    db: Database, database_url: str
) -> None:
    for round_ in range(10):
        recipient = f"race-{round_}@example.com"
        await notification_service(db).enqueue_many([new(recipient=recipient) for _ in range(2)])
        pools = [Database(database_url, pool_size=1) for _ in range(2)]
        await asyncio.gather(*(p.open() for p in pools))
        try:
            # Each worker claims one notification for the same recipient with one slot left.
            batches = await asyncio.gather(
                *(delivery_service(p, rate_limit=1).claim(1) for p in pools)
            )
        finally:
            await asyncio.gather(*(p.close() for p in pools))
        admitted = sum(len(b.claimed) for b in batches)
        assert admitted <= 1


async def test_other_recipients_are_not_slowed_by_a_limited_one(db: Database) -> None:
    service = notification_service(db)
    await service.enqueue_many([new(recipient="loud@example.com") for _ in range(5)])
    quiet = await service.enqueue_many([new() for _ in range(3)])
    batch = await delivery_service(db, rate_limit=1).claim(20)
    ids = {c.id for c in batch.claimed}
    assert {q.notification.id for q in quiet} <= ids and len(ids) == 4


async def test_a_failed_attempt_gives_its_slot_back(db: Database) -> None:
    service = notification_service(db)
    await service.enqueue(new(recipient="x@example.com"))
    delivery = delivery_service(db, rate_limit=1)
    claimed = (await delivery.claim(1)).claimed
    await delivery.complete([(claimed[0], DeliveryResult(Outcome.PERMANENT_FAILURE, error="no"))])
    await service.enqueue(new(recipient="x@example.com"))
    assert len((await delivery.claim(1)).claimed) == 1


async def test_a_claim_handed_back_at_shutdown_gives_its_slot_back(db: Database) -> None:
    service = notification_service(db)
    handed_back = await service.enqueue(new(recipient="y@example.com"))
    delivery = delivery_service(db, rate_limit=1)
    assert await delivery.release((await delivery.claim(1)).claimed) == 1
    # The only place is free again: the more urgent one takes it. Had the released claim kept
    # it, that notification would be admitted on its own place and this one would wait.
    urgent = await service.enqueue(new(recipient="y@example.com", priority=Priority.HIGH))
    batch = await delivery.claim(10)
    assert [c.id for c in batch.claimed] == [urgent.notification.id]
    assert len(batch.rate_limited) == 1
    waiting = await service.get(handed_back.notification.id)
    assert waiting.status is Status.PENDING and waiting.attempt_count == 0


async def test_a_policy_overrides_the_default_limit(db: Database) -> None:
    await PolicyRepository(db).policy_upsert(
        policy=Policy(name="team/strict", rate_limit=1, rate_window_seconds=60)
    )
    service = notification_service(db)
    await service.enqueue_many(
        [new(recipient="p@example.com", policy="team/strict") for _ in range(3)]
    )
    batch = await delivery_service(db, rate_limit=100).claim(10)
    assert len(batch.claimed) == 1 and len(batch.rate_limited) == 2
