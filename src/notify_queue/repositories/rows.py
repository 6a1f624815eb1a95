"""Row-to-model mapping, shared by the repositories."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from notify_queue.models import (
    CHANNEL_BY_VALUE,
    NewNotification,
    Notification,
    Preferences,
    Priority,
    Recipient,
    Retry,
    Source,
    Status,
    Template,
    TemplateRef,
    current_waiting,
)


def notification_from_row(row: dict[str, Any]) -> Notification:
    status = Status(row["status"])
    return Notification(
        id=row["id"],
        idempotency_key=row["idempotency_key"],
        channel=CHANNEL_BY_VALUE[row["channel"]],
        recipient=row["recipient"],
        subject=row["subject"],
        body=row["body"],
        priority=Priority.from_rank(row["priority"]),
        status=status,
        send_at=row["send_at"],
        next_attempt_at=row["next_attempt_at"],
        expires_at=row["expires_at"],
        attempt_count=row["attempt_count"],
        max_attempts=row["max_attempts"],
        last_error=row["last_error"],
        sent_at=row["sent_at"],
        provider_message_id=row["provider_message_id"],
        retries=[
            Retry(datetime.fromisoformat(r["at"]), Status(r["fromStatus"])) for r in row["retries"]
        ],
        source=Source(row["source"]),
        policy=row["policy"],
        webhook_url=row["webhook_url"],
        metadata=row["metadata"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        # Only a SENT notification has a provider (the one that sent it).
        # Before that, the column holds the provider an attempt is bound to (docs/providers.md).
        provider=row.get("provider") if row["status"] == Status.SENT else None,
        delivery_attempts=row.get("delivery_attempts") or [],
        category=row["category"],
        recipient_id=row["recipient_id"],
        template=(
            TemplateRef(row["template_name"], row["template_version"])
            if row["template_name"] is not None
            else None
        ),
        # Shown only while it holds: a row whose `until` has passed is due (models.py), judged
        # on this process's clock at the moment of reading (the row's times are the database's;
        # the clocks of one installation agree to far less than any wait it shows).
        waiting=current_waiting(
            status,
            row.get("waiting_reason"),
            row.get("waiting_until"),
            row.get("waiting_detail"),
        ),
        escalation_id=row.get("escalation_id"),
    )


def enqueued_notifications(
    sent: Sequence[NewNotification], row: dict[str, Any]
) -> list[Notification]:
    """The notifications notification_enqueue_pending inserted, from what the requests said
    (`sent`) and its one row of arrays (an element per inserted row, matched by id; a key that
    existed inserted none)."""
    ids = row["ids"]
    if ids is None:  # no row inserted
        return []
    by_id = {n.id: n for n in sent}
    created = row["created_ats"] or [row["created_at"]] * len(ids)
    updated = row["updated_ats"] or [row["updated_at"]] * len(ids)
    columns = zip(
        ids,
        row["max_attempts"],
        created,
        updated,
        row["waiting_reasons"],
        row["waiting_untils"],
        row["waiting_details"],
        row["metadata"],
        strict=True,
    )
    return [
        enqueued_notification(by_id[id], attempts, at, changed, reason, until, detail, metadata)
        for id, attempts, at, changed, reason, until, detail, metadata in columns
    ]


def enqueued_notification(
    n: NewNotification,
    max_attempts: int,
    created_at: datetime,
    updated_at: datetime,
    waiting_reason: str | None,
    waiting_until: datetime | None,
    waiting_detail: str | None,
    metadata: dict[str, Any],
) -> Notification:
    """A notification just inserted: what the request said, and what the server decided
    (max_attempts, the times, the waiting fields, metadata as jsonb stores it). Equal to
    notification_from_row of the stored row, so the create's answer is the one a read gives
    (tests/api/test_create_answer.py)."""
    return Notification(
        id=n.id,
        idempotency_key=n.idempotency_key,
        channel=n.channel,
        recipient=n.recipient,
        subject=n.subject,
        body=n.body,
        priority=n.priority,
        status=Status.PENDING,
        send_at=n.send_at,
        next_attempt_at=n.send_at,
        expires_at=n.expires_at,
        attempt_count=0,
        max_attempts=max_attempts,
        last_error=None,
        sent_at=None,
        provider_message_id=None,
        retries=[],
        source=n.source,
        policy=n.policy,
        webhook_url=n.webhook_url,
        metadata=metadata,
        created_at=created_at,
        updated_at=updated_at,
        category=n.category,
        recipient_id=n.recipient_id,
        template=n.template,
        waiting=current_waiting(Status.PENDING, waiting_reason, waiting_until, waiting_detail),
    )


def preferences_from_row(row: dict[str, Any]) -> Preferences:
    return Preferences(
        exists=True,
        opt_out_all=row["opt_out_all"],
        opt_out_channels=frozenset(row["opt_out_channels"]),
        opt_out_categories=frozenset(row["opt_out_categories"]),
        timezone=row["timezone"],
        quiet_start=row["quiet_start"],
        quiet_end=row["quiet_end"],
    )


def recipient_from_row(row: dict[str, Any]) -> Recipient:
    return Recipient(
        id=row["id"],
        email=row["email"],
        phone=row["phone"],
        voice=row.get("voice"),
        chat=row.get("chat"),
        webhook=row.get("webhook"),
        incident=row.get("incident"),
        push_tokens=list(row["push_tokens"]),
        preferences=preferences_from_row(row),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def template_from_row(row: dict[str, Any]) -> Template:
    return Template(
        name=row["name"],
        channels=row["channels"],
        version=row["version"],
        source=Source(row["source"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )
