"""Delivery receipts and the suppression list (docs/receipts.md): one statement per call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg.types.json import Jsonb

from notify_queue.models import DEFAULT_TENANT, ReceiptOutcome, Suppression
from notify_queue.repositories.db import Connection, Database


class ReceiptRepository:
    def __init__(self, db: Database, *, default_webhook_url: str | None) -> None:
        self._db = db
        # The event of a receipt goes where the notification's others go (docs/webhooks.md).
        self._default_webhook_url = default_webhook_url

    async def receipts_record(self, *, events: Sequence[dict[str, Any]]) -> list[ReceiptOutcome]:
        """Store verified receipts, each naming its provider; what each came to, in order."""
        rows = await self._db.fetch_all(
            "receipts_record",
            {
                "events": Jsonb(list(events)),
                "default_webhook_url": self._default_webhook_url,
            },
        )
        return [ReceiptOutcome(r["state"], r["matched"], r["changed"]) for r in rows]

    async def suppressions_list(
        self,
        *,
        channel: str | None,
        address: str | None,
        after: tuple[str, str] | None,
        limit: int,
        tenant: str = DEFAULT_TENANT,
    ) -> list[Suppression]:
        rows = await self._db.fetch_all(
            "suppressions_list",
            {
                "tenant": tenant,
                "channel": channel,
                "address": address,
                "after_channel": after[0] if after else None,
                "after_address": after[1] if after else None,
                "limit": limit,
            },
        )
        return [
            Suppression(r["channel"], r["address"], r["reason"], r["at"], r["notification_id"])
            for r in rows
        ]

    async def suppression_delete(
        self, *, channel: str, address: str, tenant: str = DEFAULT_TENANT
    ) -> bool:
        row = await self._db.fetch_one(
            "suppression_delete", {"tenant": tenant, "channel": channel, "address": address}
        )
        return row is not None


async def suppressions_find(
    db: Database | Connection, *, pairs: Sequence[tuple[str, str]], tenant: str = DEFAULT_TENANT
) -> dict[tuple[str, str], str]:
    """The suppressed ones of these (channel, address) pairs, each with its reason, keyed as
    given (the list compares addresses normalised). One statement; none for no pairs."""
    if not pairs:
        return {}
    rows = await db.fetch_all(
        "suppressions_find",
        {
            "tenant": tenant,
            "channels": [c for c, _ in pairs],
            "addresses": [a for _, a in pairs],
        },
    )
    return {(r["channel"], r["address"]): r["reason"] for r in rows}
