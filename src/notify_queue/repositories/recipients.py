"""Recipients and templates: the CRUD behind `/recipients` and `/templates` (and the mirror of
NotificationTemplate resources). One statement per call, each through a primary key."""

from __future__ import annotations

from datetime import time
from typing import Any, TypedDict

from psycopg.types.json import Jsonb

from notify_queue.models import Recipient, Source, Template
from notify_queue.repositories.db import Database
from notify_queue.repositories.rows import recipient_from_row, template_from_row


class RecipientRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def recipient_put(self, *, recipient: Recipient) -> tuple[Recipient, bool]:
        """Create or replace; return the stored recipient and whether it was created."""
        row = await self._db.fetch_one(
            "recipient_put",
            _put_params(recipient),
        )
        assert row is not None
        return recipient_from_row(row), bool(row["created"])

    async def recipient_get(self, *, id: str) -> Recipient | None:
        row = await self._db.fetch_one("recipient_get", {"id": id})
        return None if row is None else recipient_from_row(row)

    async def recipient_delete(self, *, id: str) -> bool:
        return await self._db.fetch_one("recipient_delete", {"id": id}) is not None

    async def recipient_merge(self, *, id: str, merge: Any) -> Recipient | None:
        """Read-modify-write under the row lock: `merge(recipient) -> recipient` decides."""
        async with self._db.transaction() as conn:
            row = await conn.fetch_one("recipient_get_for_update", {"id": id})
            if row is None:
                return None
            merged: Recipient = merge(recipient_from_row(row))
            stored = await conn.fetch_one(
                "recipient_put",
                _put_params(merged),
            )
        assert stored is not None
        return recipient_from_row(stored)

    async def template_put(
        self, *, name: str, channels: dict[str, dict[str, str]], source: Source
    ) -> tuple[Template, bool]:
        """Create or update; the version moves only on a change. Return it and whether created."""
        row = await self._db.fetch_one(
            "template_put", {"name": name, "channels": Jsonb(channels), "source": source.value}
        )
        if row is None:  # the same content again: unchanged
            current = await self._db.fetch_one("template_get", {"name": name})
            assert current is not None
            return template_from_row(current), False
        return template_from_row(row), bool(row["created"])

    async def template_get(self, *, name: str) -> Template | None:
        row = await self._db.fetch_one("template_get", {"name": name})
        return None if row is None else template_from_row(row)

    async def templates_get(self, *, names: list[str]) -> dict[str, Template]:
        rows = await self._db.fetch_all("template_get_many", {"names": names})
        return {r["name"]: template_from_row(r) for r in rows}

    async def template_delete(self, *, name: str) -> bool:
        return await self._db.fetch_one("template_delete", {"name": name}) is not None


class RecipientPut(TypedDict):
    """`recipient_put`: the recipient's contacts and preferences, replacing the stored ones."""

    id: str
    email: str | None
    phone: str | None
    voice: str | None
    chat: str | None
    webhook: str | None
    incident: str | None
    push_tokens: list[str]
    timezone: str
    opt_out_all: bool
    opt_out_channels: list[str]
    opt_out_categories: list[str]
    quiet_start: time | None
    quiet_end: time | None


def _put_params(recipient: Recipient) -> RecipientPut:
    p = recipient.preferences
    return {
        "id": recipient.id,
        "email": recipient.email,
        "phone": recipient.phone,
        "voice": recipient.voice,
        "chat": recipient.chat,
        "webhook": recipient.webhook,
        "incident": recipient.incident,
        "push_tokens": recipient.push_tokens,
        "timezone": p.timezone,
        "opt_out_all": p.opt_out_all,
        "opt_out_channels": sorted(p.opt_out_channels),
        "opt_out_categories": sorted(p.opt_out_categories),
        "quiet_start": p.quiet_start,
        "quiet_end": p.quiet_end,
    }
