"""Escalations: the create (an escalation row and one queue row per step, one statement), the
read, and the acknowledgement (lock the escalation, mark it, cancel its pending steps).

Lock order (docs/escalation.md): the escalation row, then its steps' queue rows. The worker's
claim locks queue rows only and reads the escalation from its snapshot, so no cycle can form.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypedDict

from notify_queue import jsontext
from notify_queue.models import (
    Escalation,
    EscalationState,
    NewNotification,
    Notification,
)
from notify_queue.repositories.db import Connection, Database
from notify_queue.repositories.driver import EscalationAcknowledge
from notify_queue.repositories.engine import EngineRepository
from notify_queue.repositories.notifications import (
    NotificationRepository,
    TargetedTransaction,
    enqueue_item,
)
from notify_queue.repositories.rows import notification_from_row


class EscalationInsert(TypedDict):
    """`escalation_insert`: the escalation, and its steps as enqueue items (JSON text) with
    their delays (`steps`: each `channel` and `afterSeconds`)."""

    items: str
    id: uuid.UUID
    recipient_id: str
    idempotency_key: str
    steps: str
    default_max_attempts: int


class EscalationRepository:
    def __init__(self, db: Database, *, default_webhook_url: str | None = None) -> None:
        self._db = db
        self._default_webhook_url = default_webhook_url
        self._notifications = NotificationRepository(db, default_webhook_url=default_webhook_url)
        # The acknowledgement's shape follows the engine (docs/scaling.md).
        self._engine = EngineRepository(db)

    @asynccontextmanager
    async def create_transaction(self, *, request_key: str) -> AsyncIterator[EscalationTransaction]:
        """One transaction for a create, serialised with every create under the same request key
        (the advisory lock user-targeted creates take), so two identical requests make one."""
        async with self._notifications.targeted_transaction(request_keys=[request_key]) as tx:
            yield EscalationTransaction(tx)

    async def escalation_get(self, *, id: uuid.UUID) -> Escalation | None:
        rows = await self._db.fetch_all("escalation_get", {"id": id})
        return _escalation(rows)

    async def provider_resolvers_read(self) -> frozenset[str]:
        """The providers whose incidents an acknowledgement resolves (workers write them)."""
        rows = await self._db.fetch_all("provider_resolvers_read")
        return frozenset(r["provider"] for r in rows)

    async def escalation_acknowledge(self, *, id: uuid.UUID, by: str | None) -> bool:
        """Acknowledge (once) and cancel every step still PENDING; False: no such escalation.
        A second acknowledgement keeps the first's time and author, and cancels what is pending
        (nothing, unless a step came back from a failed attempt: the claim would cancel it)."""
        params: EscalationAcknowledge = {
            "id": id,
            "by": by,
            "default_webhook_url": self._default_webhook_url,
        }
        return await (await self._engine.driver()).escalation_acknowledge(self._db, params)


class EscalationTransaction:
    """The reads and the insert of one escalation create, inside its transaction."""

    def __init__(self, tx: TargetedTransaction) -> None:
        self.targeted = tx

    @property
    def _conn(self) -> Connection:
        return self.targeted._conn

    async def escalation_insert(
        self,
        *,
        id: uuid.UUID,
        recipient_id: str,
        idempotency_key: str,
        steps: Sequence[tuple[NewNotification, int]],
        default_max_attempts: int,
    ) -> list[Notification]:
        """Insert the escalation and its steps (each with its afterSeconds); the rows inserted,
        in step order (fewer than the steps: a key was taken, roll back)."""
        # Each step is an enqueue item (the same JSON fields) with its delay instead of a time.
        items: list[dict[str, Any]] = [
            {
                **{k: v for k, v in enqueue_item(position, n).items() if k != "send_at"},
                "after_seconds": after,
                "waiting_detail": n.escalation_detail,
            }
            for position, (n, after) in enumerate(steps)
        ]
        params: EscalationInsert = {
            "items": jsontext.dumps_text(items),
            "id": id,
            "recipient_id": recipient_id,
            "idempotency_key": idempotency_key,
            "steps": jsontext.dumps_text(
                [{"channel": n.channel.value, "afterSeconds": a} for n, a in steps]
            ),
            "default_max_attempts": default_max_attempts,
        }
        rows = await self._conn.fetch_all("escalation_insert", params)
        return [notification_from_row(r) for r in rows]


def _escalation(rows: list[dict[str, Any]]) -> Escalation | None:
    if not rows:
        return None
    first = rows[0]
    return Escalation(
        id=first["escalation"],
        state=EscalationState(first["escalation_state"]),
        recipient_id=first["escalation_recipient_id"],
        acknowledged_at=first["escalation_acknowledged_at"],
        acknowledged_by=first["escalation_acknowledged_by"],
        created_at=first["escalation_created_at"],
        notifications=tuple(notification_from_row(r) for r in rows),
    )
