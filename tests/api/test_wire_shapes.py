"""The hand-built answer of a notification (`schemas.notification_json`) is exactly what the
documented pydantic model (`schemas.Notification`) serialises to: the same keys in the same
order and the same values, for a fresh notification and for one with every optional part set
(`waiting` included)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

from notify_queue import jsontext
from notify_queue.api.schemas import Notification, notification_json
from notify_queue.models import (
    Channel,
    Priority,
    Retry,
    Source,
    Status,
    TemplateRef,
    Waiting,
    WaitingReason,
)
from notify_queue.models import Notification as Stored

_NOW = datetime(2026, 9, 24, 12, 0, 0, 123456, tzinfo=UTC)


def _fresh() -> Stored:
    return Stored(
        id=uuid.uuid4(),
        idempotency_key="order-1001-receipt",
        channel=Channel.EMAIL,
        recipient="a@example.com",
        subject=None,
        body="hello",
        priority=Priority.NORMAL,
        status=Status.PENDING,
        send_at=_NOW,
        next_attempt_at=_NOW,
        expires_at=None,
        attempt_count=0,
        max_attempts=6,
        last_error=None,
        sent_at=None,
        provider_message_id=None,
        retries=[],
        source=Source.API,
        policy=None,
        webhook_url=None,
        metadata={},
        created_at=_NOW,
        updated_at=_NOW,
    )


def _everything_set() -> Stored:
    other_zone = timezone(timedelta(hours=2))
    return Stored(
        id=uuid.uuid4(),
        idempotency_key="k-2",
        channel=Channel.SMS,
        recipient="+4915112345678",
        subject="Subject ü",
        body="body \u2603",
        priority=Priority.HIGH,
        status=Status.SENT,
        send_at=_NOW.astimezone(other_zone),
        next_attempt_at=_NOW + timedelta(seconds=1),
        expires_at=_NOW + timedelta(days=1),
        attempt_count=2,
        max_attempts=3,
        last_error="503: busy",
        sent_at=_NOW + timedelta(seconds=2),
        provider_message_id="msg-1",
        retries=[Retry(_NOW, Status.DEAD_LETTERED), Retry(_NOW, Status.FAILED)],
        source=Source.KUBERNETES,
        policy="ns/p",
        webhook_url="https://example.com/hook",
        metadata={"order": 1001, "nested": {"a": [1, 2.5, None, True]}},
        created_at=_NOW,
        updated_at=_NOW + timedelta(microseconds=1),
        category="critical",
        recipient_id="user-1",
        template=TemplateRef("receipt", 3),
        provider="sms-main",
        delivery_attempts=[
            {
                "at": "2026-09-24T12:00:01.5Z",
                "provider": "sms-main",
                "outcome": "temporary_failure",
                "error": "503",
                "durationMs": 12,
            },
            {
                "at": "2026-09-24T12:00:02Z",
                "provider": "sms-main",
                "outcome": "sent",
                "error": None,
                "durationMs": 3.5,
            },
        ],
        waiting=Waiting(
            WaitingReason.CIRCUIT_OPEN, _NOW.astimezone(other_zone), "provider a's circuit is open"
        ),
    )


def test_a_fresh_notification_serialises_as_its_model_does() -> None:
    n = _fresh()
    expected = Notification.of(n).model_dump(mode="json", by_alias=True)
    assert jsontext.dumps(notification_json(n)) == jsontext.dumps(expected)


def test_a_notification_with_every_part_set_serialises_as_its_model_does() -> None:
    n = _everything_set()
    expected = Notification.of(n).model_dump(mode="json", by_alias=True)
    assert jsontext.dumps(notification_json(n)) == jsontext.dumps(expected)
