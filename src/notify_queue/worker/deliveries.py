"""The worker's deliveries in flight: claimed notifications, delivered by long-lived tasks.

A task per delivery (`create_task`, its first step scheduled and run as a handle, the
`current_task` lookup and the bookkeeping on the way out) is a visible share of a worker's CPU
when the provider answers at once (docs/performance.md). Here up to `size` (--concurrency)
runners take claimed notifications from one queue, in the order claimed, each delivering one at
a time. A runner is made when there is work and no idle runner, and then lives as long as the
pool.

Waking: one runner is woken at a time. A runner that takes a notification while others wait
wakes one more, unless one woken already has not run yet: when deliveries finish without waiting
(a provider that answers at once), the first runner delivers the whole batch and one other wakes
to find nothing, instead of a wake-up per notification; when they wait for their provider, each
runner's first step wakes the next, and the batch fans out to as many runners as it needs.

Each delivery runs inside its runner's task, so the worker's deadline (worker/deadlines.py)
cancels that runner's current call, which ends as a result (TimeoutError) and the runner goes on.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")  # a claimed notification (runner.Worker); anything in the tests


class Deliveries(Generic[T]):
    """Claimed notifications waiting or being delivered, at most `size` delivered at once."""

    def __init__(self, size: int, deliver: Callable[[T], Awaitable[None]]) -> None:
        self._size = size
        self._deliver = deliver
        self._waiting: collections.deque[T] = collections.deque()
        # runner -> the notification it is delivering now
        self._delivering: dict[asyncio.Task[None], T] = {}
        self._runners: set[asyncio.Task[None]] = set()
        self._idle: collections.deque[asyncio.Future[None]] = collections.deque()
        self._woken = 0  # runners woken (or made) that have not taken their first step yet
        # Set whenever a delivery ends: the claimer waits on it when every slot is taken.
        self.slot_free = asyncio.Event()

    def __len__(self) -> int:
        """In flight: waiting for a runner or being delivered."""
        return len(self._waiting) + len(self._delivering)

    @property
    def free(self) -> int:
        """How many more may be started before `size` are in flight."""
        return self._size - len(self)

    def start(self, claimed: Iterable[T]) -> None:
        """Deliver these, in this order, after the ones already waiting."""
        self._waiting.extend(claimed)
        if self._waiting:
            self._wake_one()

    async def settle(self, timeout: float) -> None:
        """Return once nothing is in flight, or after `timeout` seconds."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while len(self):
                    self.slot_free.clear()
                    await self.slot_free.wait()

    async def stop(self) -> list[T]:
        """Cancel every runner, for good; the notifications not delivered (being delivered or
        waiting), which the caller hands back."""
        unfinished = [*self._delivering.values(), *self._waiting]
        self._waiting.clear()
        runners = list(self._runners)
        self._runners.clear()
        for runner in runners:
            runner.cancel()
        for runner in runners:
            with contextlib.suppress(asyncio.CancelledError):
                await runner
        return unfinished

    def _wake_one(self) -> None:
        if self._woken:
            return  # a runner on its way takes the next one
        if self._idle:
            self._woken += 1
            self._idle.popleft().set_result(None)
        elif len(self._runners) < self._size:
            self._woken += 1
            self._runners.add(asyncio.create_task(self._run(), name="delivery"))

    async def _run(self) -> None:
        runner = asyncio.current_task()
        assert runner is not None
        loop = asyncio.get_running_loop()
        self._woken -= 1
        try:
            while True:
                if not self._waiting:
                    await self._idle_until_woken(loop)
                    continue
                claimed = self._waiting.popleft()
                if self._waiting:
                    self._wake_one()
                self._delivering[runner] = claimed
                try:
                    await self._deliver(claimed)
                finally:
                    del self._delivering[runner]
                    self.slot_free.set()
        except Exception:
            # The worker's delivery turns every error into a result: this is a bug of ours.
            log.exception("a delivery runner failed")
        finally:
            # Ended by stop() (nothing waits then), or by an exception a delivery let through:
            # another runner takes what waits.
            self._runners.discard(runner)
            if self._waiting:
                self._wake_one()

    async def _idle_until_woken(self, loop: asyncio.AbstractEventLoop) -> None:
        idle = loop.create_future()
        self._idle.append(idle)
        try:
            await idle
        except asyncio.CancelledError:
            if idle.cancelled():
                self._idle.remove(idle)  # cancelled while idle
            else:
                self._woken -= 1  # woken, and cancelled before it ran
            raise
        self._woken -= 1
