"""The notification rules the API and the operator share: enqueue (idempotent), read, list,
cancel, retry, and the queue's status.

Idempotency is decided by the database (a unique key), so it holds across API processes: the
service inserts, and for every key that already existed compares the stored request hash with
this one: the same request is answered with the original (200), a different one is a conflict
(409).
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Sequence
from datetime import datetime

from notify_queue.errors import Conflict, FieldError, NotFound, ValidationFailed
from notify_queue.models import (
    RETRYABLE_STATUSES,
    CreateResult,
    NewNotification,
    Notification,
    QueueStatus,
    Status,
)
from notify_queue.repositories.notifications import NotificationRepository
from notify_queue.services.wakeups import DebouncedWaker

MAX_BATCH = 1000
MAX_PAGE = 1000


class NotificationService:
    def __init__(
        self,
        repository: NotificationRepository,
        *,
        default_max_attempts: int,
        waker: DebouncedWaker | None = None,
    ) -> None:
        self._repository = repository
        self._default_max_attempts = default_max_attempts
        self._waker = waker

    async def enqueue(self, notification: NewNotification) -> CreateResult:
        return (await self.enqueue_many([notification]))[0]

    async def enqueue_many(self, notifications: Sequence[NewNotification]) -> list[CreateResult]:
        """Enqueue a batch in two statements at most; one result per item, in order."""
        if len(notifications) > MAX_BATCH:
            raise ValidationFailed([FieldError("notifications", f"at most {MAX_BATCH} items")])
        inserted = {
            n.idempotency_key: n
            for n in await self._repository.notifications_insert(
                notifications=notifications, default_max_attempts=self._default_max_attempts
            )
        }
        missing = [n.idempotency_key for n in notifications if n.idempotency_key not in inserted]
        existing = (
            await self._repository.notifications_get_by_keys(idempotency_keys=missing)
            if missing
            else {}
        )
        if inserted and self._waker is not None:
            await self._waker.poke()
        results: list[CreateResult] = []
        first_of_key: set[str] = set()
        for n in notifications:
            key = n.idempotency_key
            if key in inserted and key not in first_of_key and inserted[key].id == n.id:
                first_of_key.add(key)
                results.append(CreateResult(inserted[key], created=True))
                continue
            stored, stored_hash = (
                (inserted[key], _hash_of_inserted(notifications, inserted[key]))
                if key in inserted
                else existing[key]
            )
            results.append(
                CreateResult(stored, created=False, conflict=stored_hash != n.request_hash)
            )
        return results

    async def get(self, id: uuid.UUID) -> Notification:
        found = await self._repository.notification_get(id=id)
        if found is None:
            raise NotFound(f"notification {id} does not exist")
        return found

    async def list(
        self,
        *,
        status: Status | None = None,
        channel: str | None = None,
        recipient: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> tuple[list[Notification], str | None]:
        """A page oldest first, and the cursor of the next page (None: this is the last)."""
        if not 1 <= limit <= MAX_PAGE:
            raise ValidationFailed([FieldError("limit", f"must be between 1 and {MAX_PAGE}")])
        after = decode_cursor(cursor) if cursor else None
        items = await self._repository.notifications_list(
            status=status, channel=channel, recipient=recipient, after=after, limit=limit + 1
        )
        if len(items) <= limit:
            return items, None
        items = items[:limit]
        return items, encode_cursor(items[-1].created_at, items[-1].id)

    async def cancel(self, id: uuid.UUID) -> Notification:
        cancelled = await self._repository.notification_cancel(id=id)
        if cancelled is not None:
            return cancelled
        current = await self.get(id)
        raise Conflict(f"notification {id} is {current.status}; only PENDING can be cancelled")

    async def retry(self, id: uuid.UUID) -> Notification:
        retried = await self._repository.notification_retry(id=id)
        if retried is None:
            current = await self.get(id)
            raise Conflict(
                f"notification {id} is {current.status}; only FAILED or DEAD_LETTERED can be "
                f"retried"
            )
        if self._waker is not None:
            await self._waker.poke()
        return retried

    async def retry_batch(self, *, status: Status, limit: int = MAX_BATCH) -> tuple[int, int]:
        """Retry up to `limit` (≤ 1,000) oldest first; return (retried, remaining)."""
        if status not in RETRYABLE_STATUSES:
            raise ValidationFailed([FieldError("status", "must be DEAD_LETTERED or FAILED")])
        if not 1 <= limit <= MAX_BATCH:
            raise ValidationFailed([FieldError("limit", f"must be between 1 and {MAX_BATCH}")])
        retried, remaining = await self._repository.notifications_retry_batch(
            status=status, limit=limit
        )
        if retried and self._waker is not None:
            await self._waker.poke()
        return retried, remaining

    async def status(self) -> QueueStatus:
        return await self._repository.queue_status()


def _hash_of_inserted(batch: Sequence[NewNotification], stored: Notification) -> str:
    """The request hash of the batch item that created `stored` (a key repeated within a batch)."""
    return next(n.request_hash for n in batch if n.id == stored.id)


def encode_cursor(created_at: datetime, id: uuid.UUID) -> str:
    raw = f"{created_at.isoformat()}|{id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created_at, _, id = raw.partition("|")
        moment = datetime.fromisoformat(created_at)
        if moment.tzinfo is None:
            raise ValueError("naive")
        return moment, uuid.UUID(id)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ValidationFailed(
            [FieldError("cursor", "is not a cursor this API returned")]
        ) from None
