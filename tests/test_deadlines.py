"""The worker's deadline around a provider call (worker/deadlines.py): kept in ticks, it must act
as `asyncio.timeout` does where it matters. A call past its deadline ends in TimeoutError at most
a tick late; a call that left in time is never cancelled afterwards (by its tick's timer, which
fires later); a cancellation from elsewhere stays a cancellation; nothing is held for calls that
have left. Decided by outcomes, with bounds of seconds, never by how fast."""

from __future__ import annotations

import asyncio

import pytest

from notify_queue.worker import deadlines
from notify_queue.worker.deadlines import Deadlines


async def test_a_call_past_its_deadline_ends_in_timeout_error() -> None:
    ticks = Deadlines()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        with ticks.within(0.2):
            await asyncio.sleep(30)
    # Not before the deadline, and at most a tick after it (plus a loaded machine's slack).
    assert 0.2 <= loop.time() - started < 0.2 + deadlines.TICK_SECONDS + 5
    # The task itself is not left cancelled: it goes on awaiting.
    await asyncio.sleep(0)
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_a_call_that_left_in_time_is_not_cancelled_when_its_tick_comes() -> None:
    """Negative control, by hand: without the call leaving its tick's set in `__exit__`, the
    tick's timer cancels this task in the sleep after the block, and the test fails."""
    ticks = Deadlines()
    with ticks.within(0.2):
        await asyncio.sleep(0)
    # Well past the tick the call was in: its timer has fired and found nothing to cancel.
    await asyncio.sleep(0.2 + 3 * deadlines.TICK_SECONDS)
    assert ticks._ticks == {}


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    ticks = Deadlines()

    async def call() -> None:
        with ticks.within(30):
            await asyncio.sleep(30)

    task = asyncio.create_task(call())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert all(not calls for calls in ticks._ticks.values())


async def test_a_cancellation_from_elsewhere_at_the_deadline_stays_a_cancellation() -> None:
    """The worker stopping cancels a delivery in the very moment its deadline passes: the stop
    wins (asyncio.timeout's rule: the cancellation is the deadline's only while no other is
    pending)."""
    ticks = Deadlines()
    expire = ticks._expire

    def expire_and_stop(tick: int) -> None:
        expire(tick)
        task.cancel()  # someone else, after the deadline and before the task resumes

    ticks._expire = expire_and_stop  # type: ignore[method-assign]

    async def call() -> None:
        with ticks.within(0.1):
            await asyncio.sleep(30)

    task = asyncio.create_task(call())
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_many_calls_share_a_tick_and_each_ends_on_its_own() -> None:
    ticks = Deadlines()

    async def call(hang: bool) -> str:
        try:
            with ticks.within(0.3):
                await asyncio.sleep(30 if hang else 0.01)
        except TimeoutError:
            return "timed out"
        await asyncio.sleep(0.5)  # past the tick: still not cancelled
        return "done"

    outcomes = await asyncio.gather(*(call(hang=i % 2 == 0) for i in range(200)))
    assert outcomes == ["timed out" if i % 2 == 0 else "done" for i in range(200)]
    assert ticks._ticks == {}


async def test_a_cancellation_left_from_before_the_block_is_not_the_deadlines() -> None:
    """A long-lived task (the worker's delivery runners) may carry a cancellation requested and
    caught earlier, never taken back. Negative control, by hand: with the count compared to zero
    instead of to the count at entry, the deadline lets CancelledError through here."""
    task = asyncio.current_task()
    assert task is not None
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.sleep(1)
    assert task.cancelling() == 1

    ticks = Deadlines()
    with pytest.raises(TimeoutError):
        with ticks.within(0.05):
            await asyncio.sleep(30)
    assert task.cancelling() == 1
    task.uncancel()
