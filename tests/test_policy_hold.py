"""Policies fail closed (migration 0006): a notification whose NotificationPolicy exists but is
not Ready is held by the claim, without using an attempt and without counting as rate-limited,
until the policy is Ready again; then it goes out under that policy. Real PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from notify_queue.models import Policy, Status
from notify_queue.repositories.db import Database
from notify_queue.repositories.policies import PolicyRepository
from tests.support import delivery_service, new, notification_service


async def _make_due(db: Database, notification_id: uuid.UUID) -> None:
    # Time travel instead of a 30-second wait: the hold's recheck moment, now. A UUID, not text.
    sql = f"UPDATE nq_jobs SET next_attempt_at = now() WHERE id = '{notification_id}'"  # noqa: S608
    async with db.connection() as conn:
        await conn.execute_script(sql)


async def test_a_notification_of_a_policy_that_is_not_ready_is_held_until_it_is(
    db: Database,
) -> None:
    policies = PolicyRepository(db)
    assert await policies.policy_upsert(policy=Policy(name="shop/strict"), ready=False)
    service = notification_service(db)
    held = await service.enqueue(new(recipient="r@example.com", policy="shop/strict"))
    free = await service.enqueue(new(recipient="r@example.com"))  # no policy row: the defaults
    delivery = delivery_service(db, rate_limit=1)

    batch = await delivery.claim(10)
    # The held row took no place in the recipient's window: the free one was admitted.
    assert [c.id for c in batch.claimed] == [free.notification.id]
    assert batch.rate_limited == []
    stored = await service.get(held.notification.id)
    assert stored.status is Status.PENDING and stored.attempt_count == 0
    wait = (stored.next_attempt_at - datetime.now(UTC)).total_seconds()
    assert 20 < wait <= 31

    await _make_due(db, held.notification.id)
    assert (await delivery.claim(10)).claimed == []  # still not Ready: held again

    changed = await policies.policy_upsert(
        policy=Policy(name="shop/strict", rate_limit=5, max_attempts=2), ready=True
    )
    assert changed
    assert not await policies.policy_upsert(
        policy=Policy(name="shop/strict", rate_limit=5, max_attempts=2), ready=True
    )
    # Ready again: the operator releases the held rows (no waiting for their recheck).
    scheduled = await service.enqueue(
        new(recipient="s@example.com", policy="shop/strict", delay_seconds=20)
    )
    assert await policies.policy_release_held(name="shop/strict") == 1
    claimed = (await delivery.claim(10)).claimed
    assert [c.id for c in claimed] == [held.notification.id]
    assert claimed[0].attempt_count == 1
    # A notification scheduled for later is not pulled forward by the release.
    later = await service.get(scheduled.notification.id)
    assert later.next_attempt_at == later.send_at > datetime.now(UTC)


async def test_readiness_changes_are_reported_once(db: Database) -> None:
    policies = PolicyRepository(db)
    assert await policies.policy_upsert(policy=Policy(name="a/p"), ready=True)  # new row
    assert not await policies.policy_upsert(policy=Policy(name="a/p", rate_limit=3), ready=True)
    assert await policies.policy_upsert(policy=Policy(name="a/p"), ready=False)
    assert not await policies.policy_upsert(policy=Policy(name="a/p"), ready=False)
    assert await policies.policy_upsert(policy=Policy(name="a/p"), ready=True)
