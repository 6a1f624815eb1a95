"""The worker's deliveries in flight (worker/deliveries.py): long-lived runners take claimed
notifications in the order claimed, never more than --concurrency at once; a batch whose
deliveries finish at once is delivered by one runner, not one wake-up per notification; one
whose deliveries wait fans out; a deadline ends a runner's call, not the runner; shutdown gets
back what was not delivered. Decided by outcomes and counts, never by how fast."""

from __future__ import annotations

import asyncio

from notify_queue.worker.deadlines import Deadlines
from notify_queue.worker.deliveries import Deliveries


async def test_deliveries_begin_in_the_order_claimed_and_never_exceed_the_size() -> None:
    begun: list[int] = []
    running = 0
    most = 0

    async def deliver(n: int) -> None:
        nonlocal running, most
        begun.append(n)
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1

    deliveries: Deliveries[int] = Deliveries(4, deliver)
    deliveries.start(range(10))
    deliveries.start(range(10, 15))
    assert len(deliveries) == 15
    await deliveries.settle(30)

    assert begun == list(range(15))
    assert most == 4
    assert len(deliveries) == 0


async def test_a_batch_that_finishes_at_once_is_delivered_by_one_runner() -> None:
    """Negative control, by hand: without `_wake_one`'s check for a runner already on its way,
    each notification taken makes one more runner (99 of them for nothing), and this fails."""
    runners: set[asyncio.Task[None] | None] = set()

    async def deliver(n: int) -> None:
        runners.add(asyncio.current_task())

    deliveries: Deliveries[int] = Deliveries(256, deliver)
    deliveries.start(range(100))
    await deliveries.settle(30)

    assert len(runners) == 1
    assert len(deliveries._runners) <= 2  # the one that delivered, the one woken for nothing


async def test_a_batch_whose_deliveries_wait_fans_out_to_a_runner_each() -> None:
    release = asyncio.Event()
    runners: set[asyncio.Task[None] | None] = set()

    async def deliver(n: int) -> None:
        runners.add(asyncio.current_task())
        await release.wait()

    deliveries: Deliveries[int] = Deliveries(256, deliver)
    deliveries.start(range(50))
    for _ in range(200):
        if len(runners) == 50:
            break
        await asyncio.sleep(0)
    assert len(runners) == 50
    release.set()
    await deliveries.settle(30)
    assert len(deliveries) == 0


async def test_a_deadline_ends_the_call_and_the_runner_delivers_the_next() -> None:
    ticks = Deadlines()
    outcomes: list[tuple[str, str]] = []

    async def deliver(n: str) -> None:
        try:
            with ticks.within(0.05):
                await asyncio.sleep(30 if n == "hangs" else 0)
            outcomes.append((n, "sent"))
        except TimeoutError:
            outcomes.append((n, "timed out"))

    deliveries: Deliveries[str] = Deliveries(1, deliver)
    deliveries.start(["hangs", "next"])
    await deliveries.settle(30)

    assert outcomes == [("hangs", "timed out"), ("next", "sent")]
    assert len(deliveries._runners) == 1


async def test_what_waits_is_delivered_when_a_delivery_ends_its_runner() -> None:
    delivered: list[int] = []

    async def deliver(n: int) -> None:
        await asyncio.sleep(0)
        if n == 0:
            raise RuntimeError("a bug let through")
        delivered.append(n)

    deliveries: Deliveries[int] = Deliveries(1, deliver)
    deliveries.start(range(5))
    await deliveries.settle(30)

    assert delivered == [1, 2, 3, 4]
    assert len(deliveries) == 0


async def test_stop_hands_back_what_is_being_delivered_and_what_waits() -> None:
    finished: list[int] = []

    async def deliver(n: int) -> None:
        await asyncio.sleep(30)
        finished.append(n)

    deliveries: Deliveries[int] = Deliveries(2, deliver)
    deliveries.start(range(5))
    for _ in range(50):
        await asyncio.sleep(0)
    await deliveries.settle(0.05)  # the grace period runs out

    unfinished = await deliveries.stop()

    assert sorted(unfinished) == [0, 1, 2, 3, 4]
    assert unfinished[2:] == [2, 3, 4]  # the waiting ones, in order, after those in progress
    assert finished == []
    assert deliveries._runners == set()


async def test_idle_runners_stop_too() -> None:
    async def deliver(n: int) -> None:
        await asyncio.sleep(0)

    deliveries: Deliveries[int] = Deliveries(8, deliver)
    deliveries.start(range(20))
    await deliveries.settle(30)
    assert deliveries._runners

    assert await deliveries.stop() == []
    assert deliveries._runners == set()
