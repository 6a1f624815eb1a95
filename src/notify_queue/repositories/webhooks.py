"""The webhook outbox's dispatch side: claim due events, record results."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import TypedDict

from notify_queue.models import WebhookEvent, WebhookResult
from notify_queue.repositories.db import Database
from notify_queue.repositories.driver import WebhookClaim
from notify_queue.repositories.engine import EngineRepository

# A statement that writes webhook events NOTIFYs this channel at its commit, whoever runs it
# (the trigger of migration 0048), so an idle relay POSTs them at once.
WEBHOOK_EVENTS_CHANNEL = "nq_webhook_events"


class WebhookResults(TypedDict):
    """`webhook_record_results`: one element per result, in each array."""

    ids: list[uuid.UUID]
    claim_tokens: list[uuid.UUID]
    states: list[str]
    retry_in_seconds: list[float | None]
    last_errors: list[str | None]


class WebhookRepository:
    def __init__(self, db: Database, engine: EngineRepository | None = None) -> None:
        self._db = db
        # The claim's shape follows the engine (docs/scaling.md).
        self._engine = engine or EngineRepository(db)

    async def webhook_events_wakeups(self, stop: asyncio.Event) -> AsyncIterator[None]:
        """One item per NOTIFY of new webhook events, and one after each (re)connect."""
        async for _ in self._db.listen((WEBHOOK_EVENTS_CHANNEL,), stop):
            yield None

    async def webhook_events_claim(
        self,
        *,
        limit: int,
        lease_seconds: float,
        max_attempts: int,
        default_url: str | None,
        default_secrets: tuple[str, ...],
    ) -> list[WebhookEvent]:
        """Claim due events, each counting one attempt; events whose last attempt's result never
        came end failed instead (see the statement). Each is signed with the secrets configured
        for its URL (docs/security.md): its policy's for the policy's own URL, `default_secrets`
        (--webhook-secret) for `default_url` (--webhook-url), none for any other URL."""
        params: WebhookClaim = {
            "limit": limit,
            "lease_seconds": lease_seconds,
            "max_attempts": max_attempts,
            "claim_token": uuid.uuid4(),
        }
        rows = await (await self._engine.driver()).webhook_events_claim(self._db, params)
        return [
            WebhookEvent(
                id=r["id"],
                notification_id=r["notification_id"],
                url=r["url"],
                payload=r["payload"],
                secrets=tuple(r["policy_secrets"] or ())
                or (default_secrets if r["url"] == default_url else ()),
                attempts=r["attempts"],
                claim_token=r["claim_token"],
            )
            for r in rows
        ]

    async def webhook_results_record(self, *, results: Sequence[WebhookResult]) -> int:
        """Record results: delivered; else pending again after retry_in_seconds; else failed."""
        if not results:
            return 0
        states = [
            "delivered"
            if r.delivered
            else ("pending" if r.retry_in_seconds is not None else "failed")
            for r in results
        ]
        params: WebhookResults = {
            "ids": [r.id for r in results],
            "claim_tokens": [r.claim_token for r in results],
            "states": states,
            "retry_in_seconds": [r.retry_in_seconds for r in results],
            "last_errors": [r.error for r in results],
        }
        return len(await self._db.fetch_all("webhook_record_results", params))

    async def webhook_traceparents(
        self, *, notification_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, str]:
        """The stored trace context of each notification that has one."""
        rows = await self._db.fetch_all("webhook_traceparents", {"ids": list(notification_ids)})
        return {r["id"]: r["traceparent"] for r in rows}

    async def webhook_next_due_at(self) -> tuple[datetime | None, datetime]:
        row = await self._db.fetch_one("webhook_next_due_at")
        assert row is not None
        return row["next_due_at"], row["now"]

    async def webhook_events_for_notification(
        self, *, notification_id: uuid.UUID
    ) -> list[dict[str, object]]:
        return await self._db.fetch_all(
            "webhook_events_for_notification", {"notification_id": notification_id}
        )
