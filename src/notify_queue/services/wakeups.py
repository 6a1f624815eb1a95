"""Debounced wake-ups: tell workers new work exists, at most once per interval.

Enqueueing a thousand notifications a second must not send a thousand NOTIFYs (each takes a
global lock at commit in PostgreSQL). The first poke in a quiet period is sent at once (leading
edge, so a lone one-time code is not delayed); pokes during the interval collapse into one sent
at its end (trailing edge, so the last notification of a burst is not missed). Workers also poll,
so a lost hint costs at most one poll interval.

A writer can carry the wake-up in its own statement instead of a statement after it (the API's
enqueue: `pg_notify` in the insert's transaction, one round trip and one statement fewer per
create statement): `take()` before the statement says whether this one should, under the same
debounce, and `owe()` afterwards covers the rest (rows written without taking, a statement that
did not send what it took): the wake-up owed is sent at the interval's end, or by the next
statement if it takes it first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from notify_queue.errors import DatabaseUnavailable

log = logging.getLogger(__name__)


class DebouncedWaker:
    def __init__(
        self,
        send: Callable[[], Awaitable[None]],
        *,
        interval_seconds: float = 0.02,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._send = send
        self._interval = interval_seconds
        self._clock = clock
        self._last_sent = float("-inf")
        self._trailing: asyncio.Task[None] | None = None

    async def poke(self) -> None:
        wait = self._last_sent + self._interval - self._clock()
        if wait <= 0 and self._trailing is None:
            self._last_sent = self._clock()
            await self._send_quietly()
        elif self._trailing is None:
            self._trailing = asyncio.create_task(self._send_later(max(wait, 0.0)))

    def take(self) -> bool:
        """Hand the next wake-up to a statement about to be written, which sends it itself (in
        its transaction) if it writes work: True when poke() would send one now (the leading
        edge of a quiet period), or when one is owed and its time has come (it is sent by that
        statement instead, and not again here). A caller given True whose statement sent nothing
        (it failed, or wrote no work) calls owe(), so what it took is not lost."""
        if self._clock() < self._last_sent + self._interval:
            return False
        if self._trailing is not None:
            self._trailing.cancel()
            self._trailing = None
        self._last_sent = self._clock()
        return True

    def owe(self) -> None:
        """Work was written without a wake-up: one is owed, sent at the interval's end (at once
        if that has passed), unless a statement written first takes it (take()). Unlike poke()
        it never sends from the caller: coalesced creates start their next statement right
        after this, and that statement carries the wake-up instead of a statement of its own."""
        if self._trailing is None:
            wait = max(self._last_sent + self._interval - self._clock(), 0.0)
            self._trailing = asyncio.create_task(self._send_later(wait))

    async def _send_later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self._trailing = None
        self._last_sent = self._clock()
        await self._send_quietly()

    async def _send_quietly(self) -> None:
        try:
            await self._send()
        except DatabaseUnavailable as exc:  # a hint; workers poll anyway
            log.debug("wake-up not sent: %s", exc)

    async def close(self) -> None:
        if self._trailing is not None:
            self._trailing.cancel()
            self._trailing = None
