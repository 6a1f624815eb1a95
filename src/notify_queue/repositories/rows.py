"""Row-to-model mapping, shared by the repositories."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from notify_queue.models import Channel, Notification, Priority, Retry, Source, Status


def notification_from_row(row: dict[str, Any]) -> Notification:
    return Notification(
        id=row["id"],
        idempotency_key=row["idempotency_key"],
        channel=Channel(row["channel"]),
        recipient=row["recipient"],
        subject=row["subject"],
        body=row["body"],
        priority=Priority.from_rank(row["priority"]),
        status=Status(row["status"]),
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
        provider=row.get("provider"),
        delivery_attempts=row.get("delivery_attempts") or [],
    )
