"""Escalations: the create (an escalation row and one queue row per step, one statement), the
read, and the acknowledgement (lock the escalation, mark it, cancel its pending steps).

Lock order (docs/escalation.md): the escalation row, then its steps' queue rows. The worker's
claim locks queue rows only and reads the escalation from its snapshot, so no cycle can form.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from notify_queue import jsontext
from notify_queue.models import (
    Engine,
    Escalation,
    EscalationState,
    NewNotification,
    Notification,
    Status,
)
from notify_queue.repositories.db import Connection, Database
from notify_queue.repositories.engine import EngineRepository
from notify_queue.repositories.notifications import (
    NotificationRepository,
    TargetedTransaction,
    citus_finish,
    enqueue_item,
)
from notify_queue.repositories.rows import notification_from_row


class EscalationRepository:
    def __init__(self, db: Database, *, default_webhook_url: str | None = None) -> None:
        self._db = db
        self._default_webhook_url = default_webhook_url
        self._notifications = NotificationRepository(db, default_webhook_url=default_webhook_url)
        # The statements' shape follows the engine (docs/scaling.md), read at most once per TTL.
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
        if (await self._engine.engine_get()).engine is Engine.CITUS:
            return await self._acknowledge_citus(id=id, by=by)
        async with self._db.transaction() as conn:
            locked = await conn.fetch_one("escalation_acknowledge_lock", {"id": id})
            if locked is None:
                return False
            if locked["acknowledged_at"] is None:
                await conn.execute(
                    "escalation_acknowledge_mark",
                    {"bucket": locked["bucket"], "id": id, "by": by},
                )
            await self._stop_steps(conn, locked, routed=False)
        return True

    async def _acknowledge_citus(self, *, id: uuid.UUID, by: str | None) -> bool:
        """The acknowledgement on Citus (citus/statements.sql): the bucket first (lock-free), so
        every lock names one shard, the escalation's and its steps'; the mark commits in a
        transaction of its own, then the steps are stopped in a second one (docs/scaling.md: one
        transaction for both crashed a worker node in COMMIT PREPARED under Citus 14.0.1). The mark
        alone is the acknowledgement: from its commit on the claim cancels any step it would hand
        out (the ESCALATION GUARD), so a second transaction that fails loses nothing but the early
        CANCELLED, which a repeated acknowledgement or the step's claim writes."""
        async with self._db.transaction() as conn:
            found = await conn.fetch_one("escalation_buckets", {"id": id})
            if found is None:
                return False
            bucket = {"id": id, "bucket": found["bucket"]}
            locked = await conn.fetch_one("escalation_acknowledge_lock_bucket", bucket)
            if locked is None:
                return False
            if locked["acknowledged_at"] is None:
                await conn.execute("escalation_acknowledge_mark", {**bucket, "by": by})
        async with self._db.transaction() as conn:
            locked = await conn.fetch_one("escalation_acknowledge_lock_bucket", bucket)
            if locked is not None:
                await self._stop_steps(conn, locked, routed=True)
        return True

    async def _stop_steps(self, conn: Connection, locked: dict[str, Any], *, routed: bool) -> None:
        """Steps 3 and 4 in the caller's transaction, the escalation row locked; `routed`: the
        Citus form, which names the bucket. Each statement named at its call (the security
        test reads the names from the code)."""
        await conn.fetch_one("notification_log_ready")
        params = {
            "ids": locked["step_ids"],
            "bucket": locked["bucket"],
            "default_webhook_url": self._default_webhook_url,
        }
        if routed:
            pending = await conn.fetch_all("escalation_steps_stop_bucket", params)
            if pending:
                await citus_finish(
                    conn,
                    bucket=locked["bucket"],
                    ids=[r["id"] for r in pending],
                    status=Status.CANCELLED,
                    last_errors=["acknowledged"] * len(pending),
                    default_webhook_url=self._default_webhook_url,
                )
        else:
            await conn.fetch_all("escalation_steps_stop", params)
        await conn.fetch_one("escalation_note_objects", {"ids": locked["step_ids"]})


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
        rows = await self._conn.fetch_all(
            "escalation_insert",
            {
                "items": jsontext.dumps_text(items),
                "id": id,
                "recipient_id": recipient_id,
                "idempotency_key": idempotency_key,
                "steps": jsontext.dumps_text(
                    [{"channel": n.channel.value, "afterSeconds": a} for n, a in steps]
                ),
                "default_max_attempts": default_max_attempts,
            },
        )
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
