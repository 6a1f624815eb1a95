"""Enqueueing at a steady rate through NotificationService, as the API does (one request, one
INSERT, a debounced wake-up for the workers), for the latency and priority scenarios."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from notify_queue.models import Channel, NewNotification, Priority, Source
from notify_queue.repositories.db import Database
from notify_queue.repositories.notifications import NotificationRepository
from notify_queue.services.notifications import NotificationService
from notify_queue.services.wakeups import DebouncedWaker


def new_notification(
    prefix: str, *, priority: Priority = Priority.NORMAL, delay_seconds: float = 0.0
) -> NewNotification:
    key = f"{prefix}-{uuid.uuid4().hex}"
    return NewNotification(
        idempotency_key=key,
        request_hash=hashlib.sha256(key.encode()).hexdigest(),
        channel=Channel.EMAIL,
        recipient=f"{key}@example.com",
        body="x" * 120,
        subject="Your code",
        priority=priority,
        send_at=datetime.now(UTC) + timedelta(seconds=delay_seconds),
        source=Source.API,
    )


class SteadyEnqueuer:
    """Sends `rate` requests a second, each its own call (several in flight, like API clients)."""

    def __init__(self, url: str) -> None:
        self.db = Database(url, pool_size=20, name="bench-enqueue")
        self.service: NotificationService | None = None
        self.waker: DebouncedWaker | None = None
        self.sent = 0
        self.late_starts = 0
        self.failed = 0
        self.max_in_flight = 32
        self.seconds = 0.0

    async def __aenter__(self) -> SteadyEnqueuer:
        await self.db.open()
        repo = NotificationRepository(self.db)
        self.waker = DebouncedWaker(repo.workers_wake)
        self.service = NotificationService(repo, default_max_attempts=6, waker=self.waker)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.waker:
            await self.waker.close()
        await self.db.close()

    async def run(
        self,
        make: Callable[[int], NewNotification],
        rate: float,
        *,
        seconds: float | None = None,
        until: asyncio.Event | None = None,
    ) -> None:
        assert self.service is not None
        service = self.service
        pending: set[asyncio.Task[object]] = set()
        start = time.monotonic()
        i = 0
        while True:
            due = start + i / rate
            now = time.monotonic()
            if seconds is not None and due - start >= seconds:
                break
            if until is not None and until.is_set():
                break
            if due > now:
                await asyncio.sleep(due - now)
            elif now - due > 0.05:
                self.late_starts += 1  # the machine could not keep the pace: recorded, not hidden
            while len(pending) >= self.max_in_flight:
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            task = asyncio.create_task(self._one(service, make(i)))
            pending.add(task)
            task.add_done_callback(pending.discard)
            self.sent += 1
            i += 1
        if pending:
            await asyncio.gather(*pending)
        self.seconds = time.monotonic() - start

    @property
    def achieved_per_second(self) -> float:
        """The rate really sent: lower than asked when the machine could not keep the pace."""
        return round(self.sent / self.seconds, 1) if self.seconds else 0.0

    async def _one(self, service: NotificationService, notification: NewNotification) -> None:
        try:
            await service.enqueue(notification)
        except Exception:
            self.failed += 1
