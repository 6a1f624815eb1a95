"""Scheduling and priority: due times, wake-ups, claim order, expiry."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from notify_queue.models import Priority, Status
from notify_queue.providers.simulated import SimulatedProvider
from notify_queue.repositories.db import Database
from notify_queue.repositories.notifications import NotificationRepository
from notify_queue.services.notifications import NotificationService
from notify_queue.services.wakeups import DebouncedWaker
from tests.support import delivery_service, eventually, new, notification_service, start_workers


async def test_claims_come_high_before_normal_before_low_then_longest_due_then_oldest(
    db: Database,
) -> None:
    now = datetime.now(UTC)
    service = notification_service(db)
    low = await service.enqueue(new(priority=Priority.LOW, send_at=now - timedelta(minutes=10)))
    normal_late = await service.enqueue(
        new(priority=Priority.NORMAL, send_at=now - timedelta(minutes=1))
    )
    normal_early = await service.enqueue(
        new(priority=Priority.NORMAL, send_at=now - timedelta(minutes=5))
    )
    high = await service.enqueue(new(priority=Priority.HIGH, send_at=now))
    claimed = (await delivery_service(db).claim(10)).claimed
    assert [c.id for c in claimed] == [
        high.notification.id,
        normal_early.notification.id,
        normal_late.notification.id,
        low.notification.id,
    ]


async def test_a_small_claim_takes_only_the_highest_priorities(db: Database) -> None:
    service = notification_service(db)
    await service.enqueue_many([new(priority=Priority.LOW) for _ in range(5)])
    highs = await service.enqueue_many([new(priority=Priority.HIGH) for _ in range(2)])
    claimed = (await delivery_service(db).claim(2)).claimed
    assert {c.id for c in claimed} == {h.notification.id for h in highs}
    counts = await db.fetch_all("queue_status_counts")
    assert {r["status"]: r["n"] for r in counts} == {"PENDING": 5, "PROCESSING": 2}


async def test_a_worker_serving_only_high_never_takes_low(db: Database) -> None:
    await notification_service(db).enqueue(new(priority=Priority.LOW))
    assert (await delivery_service(db, priorities=[Priority.HIGH]).claim(10)).claimed == []


async def test_a_scheduled_notification_is_not_claimed_before_its_time(db: Database) -> None:
    await notification_service(db).enqueue(new(delay_seconds=60))
    assert (await delivery_service(db).claim(10)).claimed == []


# The workers below poll every ten minutes, so only a wake-up can deliver within the deadlines
# here: each test is decided by what happened (sent, never early), not by how fast. How soon
# after the wake-up or the due time they go out is a speed figure, measured by the latency
# benchmark (`python -m benchmarks latency`: p50/p99 from enqueue, and scheduled lateness).
POLL_SECONDS = 600.0


async def test_a_due_notification_wakes_an_idle_worker_at_once_not_at_the_next_poll(
    db: Database, database_url: str
) -> None:
    provider = SimulatedProvider(0.0, 0.0, 1.0)
    workers = await start_workers(database_url, provider, poll_interval=POLL_SECONDS)
    waker = DebouncedWaker(NotificationRepository(db).workers_wake)
    service = NotificationService(NotificationRepository(db), default_max_attempts=6, waker=waker)
    try:
        await asyncio.sleep(0.5)  # the worker is idle, sleeping until its next poll
        created = await service.enqueue(new())
        await eventually(
            lambda: _status(db, created.notification.id, Status.SENT),
            timeout=60,
            interval=0.01,
            what="SENT before the next poll (the NOTIFY wake-up did not reach the worker)",
        )
    finally:
        await waker.close()
        await workers.stop()


async def test_a_scheduled_notification_goes_out_on_time_not_at_the_next_poll(
    db: Database, database_url: str
) -> None:
    provider = SimulatedProvider(0.0, 0.0, 1.0)
    workers = await start_workers(database_url, provider, poll_interval=POLL_SECONDS)
    waker = DebouncedWaker(NotificationRepository(db).workers_wake)
    service = NotificationService(NotificationRepository(db), default_max_attempts=6, waker=waker)
    try:
        await asyncio.sleep(0.3)
        due = datetime.now(UTC) + timedelta(seconds=1.5)
        created = await service.enqueue(new(send_at=due))
        stored = await eventually(
            lambda: _status(db, created.notification.id, Status.SENT),
            timeout=60,
            interval=0.01,
            what="SENT before the next poll (the worker did not sleep until the due time)",
        )
        assert stored.sent_at is not None
        assert stored.sent_at >= due, f"sent {(due - stored.sent_at).total_seconds()}s early"
    finally:
        await waker.close()
        await workers.stop()


async def _status(db: Database, id: object, status: Status) -> object:
    n = await notification_service(db).get(id)  # type: ignore[arg-type]
    return n if n.status is status else None


async def test_a_notification_not_sent_before_it_expires_becomes_expired_with_a_webhook_event(
    db: Database,
) -> None:
    now = datetime.now(UTC)
    created = await notification_service(db).enqueue(
        new(
            send_at=now + timedelta(seconds=0.2),
            expires_at=now + timedelta(seconds=0.4),
            webhook_url="http://hooks.example/expired",
        )
    )
    await asyncio.sleep(0.5)
    assert (await delivery_service(db).claim(10)).claimed == []  # expired rows are never claimed
    _, _, expired = await delivery_service(db).housekeeping()
    assert expired == 1
    stored = await notification_service(db).get(created.notification.id)
    assert stored.status is Status.EXPIRED
    events = await db.fetch_all("webhook_events_for_notification", {"notification_id": stored.id})
    assert len(events) == 1 and '"EXPIRED"' in events[0]["payload"]
