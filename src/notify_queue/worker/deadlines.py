"""The worker's deadline around each provider call, kept in ticks rather than one timer per call.

`asyncio.timeout` arms a timer per use (a `TimerHandle` pushed on the loop's heap, cancelled on the
way out), which costs more of the worker's CPU per delivery than the simulated provider's whole
call. The deadline is a safety net behind the provider's own timeout (routing.py: its timeout + a
margin of a second), so it needs no sub-second precision: every call whose deadline falls within the
same tick (0.1 s) shares one timer, and a call past its deadline is cancelled at the end of that
tick, at most a tick late. Entering is a dict lookup and a set insertion, leaving removes the call
from its tick's set: a tick's timer never touches a call that has left, and nothing is held for
calls that have.

Inside the block a deadline works as `asyncio.timeout`'s does: the task is cancelled, and on the
way out a cancellation this deadline caused becomes `TimeoutError`; one from anywhere else (the
worker stopping) stays a cancellation.
"""

from __future__ import annotations

import asyncio
import math
from types import TracebackType

TICK_SECONDS = 0.1


class Deadlines:
    """Deadlines for the calls of one event loop (one per worker process)."""

    def __init__(self) -> None:
        # tick -> the calls in flight whose deadline falls in it (a call leaves its set on the
        # way out, so a set holds only calls still running).
        self._ticks: dict[int, set[_Within]] = {}

    def within(self, seconds: float) -> _Within:
        """`with deadlines.within(s):` around awaits cancels the block once `s` seconds (rounded
        up to the next tick) have passed, raising TimeoutError."""
        return _Within(self, seconds)

    def _tick(self, seconds: float) -> set[_Within]:
        loop = asyncio.get_running_loop()
        tick = math.ceil((loop.time() + seconds) / TICK_SECONDS)
        calls = self._ticks.get(tick)
        if calls is None:
            calls = self._ticks[tick] = set()
            loop.call_at(tick * TICK_SECONDS, self._expire, tick)
        return calls

    def _expire(self, tick: int) -> None:
        for call in self._ticks.pop(tick, ()):
            call.expire()


class _Within:
    __slots__ = ("_calls", "_cancelling", "_deadlines", "_expired", "_seconds", "_task")

    def __init__(self, deadlines: Deadlines, seconds: float) -> None:
        self._deadlines = deadlines
        self._seconds = seconds
        self._expired = False

    def __enter__(self) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline needs a task to cancel")
        self._task = task
        # Cancellations requested before this block (and never taken back) are not this
        # deadline's: a long-lived task (worker/deliveries.py) may carry one from an earlier call.
        self._cancelling = task.cancelling()
        self._calls = self._deadlines._tick(self._seconds)
        self._calls.add(self)

    def expire(self) -> None:
        self._expired = True
        self._task.cancel()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._calls.discard(self)
        if self._expired:
            # This deadline cancelled the task: the cancellation ends here, as TimeoutError,
            # unless someone else cancelled it too (then it goes on), as `asyncio.timeout` does.
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc
