"""The debounced wake-up, when a create's own statement carries it (DebouncedWaker.take).

A burst of create statements wakes the workers at most once per interval, whether the wake-up
goes inside a statement (`take()` said so) or as a statement of its own (the owed one, at the
interval's end); a wake-up a statement took and did not send is handed back with `owe()`. The
waker's clock is a test's own here, so nothing depends on how fast the machine is; the last test
shows the wake-up of a create arriving from the create's own statement (a LISTEN on the real
database).
"""

from __future__ import annotations

import asyncio
import uuid

import psycopg

from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery import WAKEUP_CHANNEL
from notify_queue.repositories.notifications import NotificationRepository
from notify_queue.services.notifications import NotificationService
from notify_queue.services.wakeups import DebouncedWaker
from tests.support import eventually, new


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Sent:
    def __init__(self) -> None:
        self.count = 0

    async def __call__(self) -> None:
        self.count += 1


async def test_a_quiet_waker_hands_the_wake_up_to_the_first_statement_only() -> None:
    sent = _Sent()
    waker = DebouncedWaker(sent, interval_seconds=10.0, clock=_Clock())

    assert waker.take() is True  # the statement sends it
    assert waker.take() is False  # within the interval: the next one does not
    waker.owe()  # rows of that one: a wake-up is owed, at the interval's end
    assert sent.count == 0
    await waker.close()


async def test_the_next_statement_after_the_interval_carries_the_owed_wake_up() -> None:
    sent = _Sent()
    clock = _Clock()
    waker = DebouncedWaker(sent, interval_seconds=10.0, clock=clock)
    assert waker.take() is True
    assert waker.take() is False
    clock.now += 10.0
    waker.owe()  # the interval is over: owed now, unless a statement takes it first

    assert waker.take() is True  # the next statement, started before the loop ran, takes it
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert sent.count == 0  # and the waker does not send it again
    await waker.close()


async def test_an_owed_wake_up_no_statement_takes_is_sent_on_its_own() -> None:
    sent = _Sent()
    waker = DebouncedWaker(sent, interval_seconds=0.0, clock=_Clock())

    assert waker.take() is True
    waker.owe()  # the statement failed or inserted nothing: handed back

    await eventually(lambda: _count_is(sent, 1), what="the owed wake-up sent")
    await waker.close()


async def _count_is(sent: _Sent, n: int) -> bool:
    return sent.count == n


async def test_a_create_wakes_the_listeners_from_its_own_statement(
    db: Database, database_url: str
) -> None:
    statements: list[int] = []

    async def separate() -> None:  # a wake-up sent as a statement of its own
        statements.append(1)

    waker = DebouncedWaker(separate, interval_seconds=3600.0)
    service = NotificationService(NotificationRepository(db), default_max_attempts=3, waker=waker)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as listener:
        await listener.execute(f"LISTEN {WAKEUP_CHANNEL}")
        first = await service.enqueue(new(key=f"a-{uuid.uuid4()}"))
        again = await service.enqueue(new(key=f"b-{uuid.uuid4()}"))  # within the interval
        assert first.created and again.created
        received = [n.channel async for n in listener.notifies(timeout=30.0, stop_after=1)]
        assert received == [WAKEUP_CHANNEL]
        assert statements == []  # no statement of its own: the second one's is owed, not sent
    await waker.close()
