"""Send slots of a rate-limited provider: reserved from one schedule shared by every worker.

Each limited provider has one schedule row (`nq_provider_schedule`); a worker reserves
consecutive slots from it in batches (`SlotBook`: one statement serves every delivery queued at
that moment) and each delivery sleeps until its slot. The exactness argument is in
docs/design.md ("Providers") and docs/providers.md; the routing (`routing.py`) decides what a
delivery that gets no slot does.
"""

from __future__ import annotations

import asyncio

from notify_queue.errors import DatabaseUnavailable
from notify_queue.repositories.providers import ProviderRepository

# Slots are spaced 4% wider than 1 / perSecond, so perSecond + 1 consecutive slots span 1.04 s.
# A send may start up to _LATE_SECONDS after its slot (a busy event loop wakes sleepers late);
# later than that the slot is given up and another taken, or a stalled worker would release its
# overdue sends in one burst. With 10 ms of lateness and 30 ms left for what happens between the
# check and the provider (the HTTP client, the network, a busy machine), no window of one second
# sees more than perSecond requests (docs/design.md "Providers"), at 96% of the limit.
_SPACING = 1.04
_LATE_SECONDS = 0.010
_SLOT_TRIES = 3


class SlotBook:
    """The send slots of one rate-limited provider, reserved from the shared schedule.

    Deliveries that want a slot queue up; one reservation statement serves everyone queued at
    that moment, so a burst of 100 deliveries costs one round trip, not 100.
    """

    def __init__(
        self, name: str, per_second: float, repository: ProviderRepository, horizon_seconds: float
    ) -> None:
        self.name = name
        self._step = _SPACING / per_second
        self._repository = repository
        self._horizon = horizon_seconds
        self._waiting: list[asyncio.Future[float | None]] = []
        self._refill: asyncio.Task[None] | None = None
        self.free_in_seconds = 0.0  # when the schedule next has room, as of the last reservation

    async def take(self) -> float | None:
        """Seconds until this delivery's slot, or None when none is free within the horizon."""
        future: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        if self._refill is None or self._refill.done():
            self._refill = asyncio.create_task(self._reserve())
        return await future

    async def _reserve(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                r = await self._repository.provider_slots_reserve(
                    provider=self.name,
                    wanted=len(batch),
                    step_seconds=self._step,
                    horizon_seconds=self._horizon,
                )
            except Exception as exc:
                for future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            now = loop.time()
            start = now + (r.first_slot - r.clock).total_seconds()
            # A float even when 0: it becomes a retry delay in a float8[] parameter, which
            # psycopg refuses to dump from a list mixing int and float.
            self.free_in_seconds = max((r.next_free - r.clock).total_seconds() - self._horizon, 0.0)
            for i, future in enumerate(batch):
                if future.done():
                    continue
                if i < r.granted:
                    future.set_result(max(start + i * self._step - now, 0.0))
                else:
                    future.set_result(None)


async def wait_for_slot(book: SlotBook) -> bool | None:
    """Sleep until this delivery's send slot; None when none is free within the horizon."""
    loop = asyncio.get_running_loop()
    for _ in range(_SLOT_TRIES):
        try:
            wait = await book.take()
        except DatabaseUnavailable:
            return None
        if wait is None:
            return None
        due = loop.time() + wait
        if wait > 0:
            await asyncio.sleep(wait)
        if loop.time() - due <= _LATE_SECONDS:
            return True
        # Woken too late: sending now could bunch with the slots after this one. Take a new one.
    return None
