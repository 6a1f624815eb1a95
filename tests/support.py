"""Helpers for tests: build services on a test database and enqueue notifications tersely."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from notify_queue.models import Channel, NewNotification, Priority, Source
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery import DeliveryDefaults, DeliveryRepository
from notify_queue.repositories.notifications import NotificationRepository
from notify_queue.services.delivery import DeliveryService
from notify_queue.services.notifications import NotificationService


def defaults(**overrides: Any) -> DeliveryDefaults:
    values: dict[str, Any] = {
        "rate_limit": 10,
        "rate_window_seconds": 3600.0,
        "backoff_base_seconds": 0.5,
        "backoff_max_seconds": 60.0,
        "lease_seconds": 300.0,
        "webhook_url": None,
    }
    values.update(overrides)
    return DeliveryDefaults(**values)


def notification_service(db: Database, *, max_attempts: int = 6) -> NotificationService:
    return NotificationService(NotificationRepository(db), default_max_attempts=max_attempts)


def delivery_service(
    db: Database, *, priorities: list[Priority] | None = None, **overrides: Any
) -> DeliveryService:
    return DeliveryService(
        DeliveryRepository(db, defaults(**overrides)),
        priorities=priorities or list(Priority),
        channels=list(Channel),
    )


def new(
    *,
    recipient: str | None = None,
    channel: Channel = Channel.EMAIL,
    priority: Priority = Priority.NORMAL,
    send_at: datetime | None = None,
    delay_seconds: float = 0.0,
    expires_at: datetime | None = None,
    key: str | None = None,
    body: str = "hello",
    policy: str | None = None,
    webhook_url: str | None = None,
) -> NewNotification:
    if recipient is None:
        recipient = f"user-{uuid.uuid4().hex[:10]}@example.com" if channel is Channel.EMAIL else "+4915112345678"
    return NewNotification(
        idempotency_key=key or uuid.uuid4().hex,
        request_hash="h-" + (key or "x"),
        channel=channel,
        recipient=recipient,
        body=body,
        priority=priority,
        send_at=send_at or (datetime.now(UTC) + timedelta(seconds=delay_seconds)),
        expires_at=expires_at,
        policy=policy,
        webhook_url=webhook_url,
        source=Source.API,
    )


async def eventually(
    check: Callable[[], Awaitable[Any]], *, timeout: float = 10.0, interval: float = 0.05
) -> Any:
    """Poll `check` until it returns something truthy, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value: {value!r})")
        await asyncio.sleep(interval)


async def status_counts(db: Database) -> dict[str, int]:
    rows = await db.fetch_all("queue_status_counts")
    return {r["status"]: r["n"] for r in rows}
