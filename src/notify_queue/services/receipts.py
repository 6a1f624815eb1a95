"""Delivery receipts and the suppression list (docs/receipts.md).

Receipts arrive verified (providers.receipts) and are stored in one statement for everything that
arrived together: a request is sent at once when fewer than `max_in_flight` statements are
running, and otherwise waits for the next free slot, which takes every request waiting by then
into one statement (group commit, as creates do: services/coalescing.py). A vendor that sends one
receipt per request (Twilio, SNS, our `http` scheme) so costs the database what a batch does.
Each caller is answered only after the statement holding its receipts committed; a failed
statement fails every request in it (the vendors retry). The same list is asked at send time by
the workers.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Sequence
from typing import Any

from notify_queue.errors import FieldError, ValidationFailed
from notify_queue.models import Receipt, ReceiptOutcome, Suppression
from notify_queue.repositories.receipts import ReceiptRepository

_Waiting = tuple[str, Sequence[Receipt], "asyncio.Future[list[ReceiptOutcome]]"]


class ReceiptService:
    def __init__(self, repository: ReceiptRepository, *, max_in_flight: int = 4) -> None:
        self._repository = repository
        self._max_in_flight = max_in_flight
        self._waiting: list[_Waiting] = []
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def record(self, provider: str, receipts: Sequence[Receipt]) -> list[ReceiptOutcome]:
        """Store `provider`'s verified receipts; what each came to, in order."""
        if not receipts:
            return []
        future: asyncio.Future[list[ReceiptOutcome]] = asyncio.get_running_loop().create_future()
        self._waiting.append((provider, receipts, future))
        if self._in_flight < self._max_in_flight:
            self._send_waiting()
        return await future

    def _send_waiting(self) -> None:
        if not self._waiting:
            return
        batch, self._waiting = self._waiting, []
        self._in_flight += 1
        task = asyncio.create_task(self._send(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[_Waiting]) -> None:
        try:
            outcomes = await self._repository.receipts_record(
                events=[_event(provider, r) for provider, receipts, _ in batch for r in receipts]
            )
        except Exception as exc:
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        else:
            start = 0
            for _, receipts, future in batch:
                if not future.done():  # a caller that went away is not answered
                    future.set_result(outcomes[start : start + len(receipts)])
                start += len(receipts)
        finally:
            self._in_flight -= 1
            self._send_waiting()

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


def _event(provider: str, r: Receipt) -> dict[str, Any]:
    return {
        "provider": provider,
        "providerMessageId": r.provider_message_id,
        "state": r.state,
        "permanent": r.permanent,
        "reason": r.reason,
        "at": r.at.isoformat() if r.at is not None else None,
    }
