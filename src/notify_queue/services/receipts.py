"""Delivery receipts and the suppression list (docs/receipts.md).

Receipts arrive verified (providers.receipts); here they are stored in one statement per
request, whatever their number (a SendGrid batch holds up to a thousand events), and the
suppression list is read and edited. The same list is asked at send time by the workers.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

from notify_queue.errors import FieldError, ValidationFailed
from notify_queue.models import Receipt, ReceiptOutcome, Suppression
from notify_queue.repositories.receipts import ReceiptRepository


class ReceiptService:
    def __init__(self, repository: ReceiptRepository) -> None:
        self._repository = repository

    async def record(self, provider: str, receipts: Sequence[Receipt]) -> list[ReceiptOutcome]:
        if not receipts:
            return []
        return await self._repository.receipts_record(
            provider=provider,
            events=[
                {
                    "providerMessageId": r.provider_message_id,
                    "state": r.state,
                    "permanent": r.permanent,
                    "reason": r.reason,
                    "at": r.at.isoformat() if r.at is not None else None,
                }
                for r in receipts
            ],
        )

    async def suppressions(
        self, *, channel: str | None, address: str | None, cursor: str | None, limit: int
    ) -> tuple[list[Suppression], str | None]:
        """A page in (channel, address) order, and the next page's cursor (None: the last)."""
        after = _decode_cursor(cursor) if cursor else None
        items = await self._repository.suppressions_list(
            channel=channel, address=address, after=after, limit=limit + 1
        )
        if len(items) <= limit:
            return items, None
        items = items[:limit]
        return items, _encode_cursor(items[-1].channel, items[-1].address)

    async def unsuppress(self, *, channel: str, address: str) -> bool:
        return await self._repository.suppression_delete(channel=channel, address=address)


def _encode_cursor(channel: str, address: str) -> str:
    return base64.urlsafe_b64encode(f"{channel}|{address}".encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[str, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raw = ""
    channel, bar, address = raw.partition("|")
    if not bar or not channel or not address:
        raise ValidationFailed([FieldError("cursor", "is not a cursor this API returned")])
    return channel, address
