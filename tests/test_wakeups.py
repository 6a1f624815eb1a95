"""The debounced wake-up, when a create's own statement carries it (DebouncedWaker.take).

A burst of create statements wakes the workers at most once per interval, whether the wake-up
goes inside a statement (`take()` said so) or as a statement of its own (`poke()`, the trailing
edge); a wake-up a statement took and did not send is handed back with `poke()`. The waker's
clock is replaced here, so nothing depends on how fast the machine is; the last test shows the
wake-up of a create arriving from the create's own statement (a LISTEN on the real database).
"""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery import WAKEUP_CHANNEL
from notify_queue.repositories.notifications import NotificationRepository
from notify_queue.services import wakeups
from notify_queue.services.notifications import NotificationService
from notify_queue.services.wakeups import DebouncedWaker
from tests.support import new


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(wakeups.time, "monotonic", fake)
    return fake


class _Sent:
    def __init__(self) -> None:
        self.count = 0

    async def __call__(self) -> None:
        self.count += 1


async def test_a_quiet_waker_hands_the_wake_up_to_the_first_statement_only(clock: _Clock) -> None:
    sent = _Sent()
    waker = DebouncedWaker(sent, interval_seconds=10.0)

    assert waker.take() is True  # the statement sends it
    assert waker.take() is False  # within the interval: the next one does not
    await waker.poke()  # rows of that one: a trailing wake-up is owed
    assert sent.count == 0
    await waker.close()


async def test_a_statement_after_the_interval_carries_the_owed_trailing_wake_up(
    clock: _Clock,
) -> None:
    sent = _Sent()
    waker = DebouncedWaker(sent, interval_seconds=10.0)
    assert waker.take() is True
    await waker.poke()  # owed, at the interval's end

    clock.now += 10.0
    assert waker.take() is True  # this statement sends the owed one
    await asyncio.sleep(0)

    assert sent.count == 0  # and the waker does not send it again
    await waker.close()


async def test_a_wake_up_taken_and_not_sent_is_sent_by_poke(clock: _Clock) -> None:
    sent = _Sent()
    waker = DebouncedWaker(sent, interval_seconds=0.0)

    assert waker.take() is True
    await waker.poke()  # the statement failed or inserted nothing

    assert sent.count == 1
    await waker.close()


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
