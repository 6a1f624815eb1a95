"""Single creates that arrive together share one `create_many` call (services.coalescing):
a lone create is sent at once, creates arriving while statements are in flight wait for the next
free slot and go in together, every caller gets its own outcome, a failed statement is retried
one create at a time, and the database being away fails every caller of that statement."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from notify_queue.errors import DatabaseUnavailable
from notify_queue.services.coalescing import CreateCoalescer


class FakeCreateMany:
    def __init__(self, *, fail_when: Any = None, gate: asyncio.Event | None = None) -> None:
        self.calls: list[list[Any]] = []
        self._fail_when = fail_when
        self._gate = gate

    async def __call__(self, requests: Sequence[Any]) -> list[Any]:
        self.calls.append(list(requests))
        if self._gate is not None:
            await self._gate.wait()
        if self._fail_when is not None and self._fail_when(requests):
            raise self._fail_exc(requests)
        return [f"done:{r}" for r in requests]

    def _fail_exc(self, requests: Sequence[Any]) -> Exception:
        return RuntimeError(f"bad batch {list(requests)}")


async def test_a_lone_create_is_sent_at_once() -> None:
    create_many = FakeCreateMany()
    coalescer = CreateCoalescer(create_many, max_in_flight=1, max_batch=1000)
    assert await coalescer.create("a") == "done:a"  # type: ignore[arg-type]
    assert create_many.calls == [["a"]]


async def test_creates_arriving_while_a_statement_runs_share_the_next_one() -> None:
    gate = asyncio.Event()
    create_many = FakeCreateMany(gate=gate)
    coalescer = CreateCoalescer(create_many, max_in_flight=1, max_batch=1000)
    tasks = [asyncio.create_task(coalescer.create(str(i))) for i in range(10)]  # type: ignore[arg-type]
    await asyncio.sleep(0)
    gate.set()
    assert await asyncio.gather(*tasks) == [f"done:{i}" for i in range(10)]
    assert create_many.calls == [["0"], [str(i) for i in range(1, 10)]]


async def test_a_batch_never_exceeds_its_limit() -> None:
    gate = asyncio.Event()
    create_many = FakeCreateMany(gate=gate)
    coalescer = CreateCoalescer(create_many, max_in_flight=1, max_batch=3)
    tasks = [asyncio.create_task(coalescer.create(str(i))) for i in range(8)]  # type: ignore[arg-type]
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(*tasks)
    assert [len(c) for c in create_many.calls] == [1, 3, 3, 1]


async def test_a_failed_statement_is_retried_one_create_at_a_time() -> None:
    gate = asyncio.Event()
    create_many = FakeCreateMany(gate=gate, fail_when=lambda requests: "bad" in requests)
    coalescer = CreateCoalescer(create_many, max_in_flight=1, max_batch=1000)
    first = asyncio.create_task(coalescer.create("x"))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    rest = [asyncio.create_task(coalescer.create(r)) for r in ("ok1", "bad", "ok2")]  # type: ignore[arg-type]
    gate.set()
    assert await first == "done:x"
    ok1, bad, ok2 = await asyncio.gather(*rest, return_exceptions=True)
    assert (ok1, ok2) == ("done:ok1", "done:ok2")
    assert isinstance(bad, RuntimeError)


async def test_the_database_being_away_fails_every_caller_of_that_statement() -> None:
    class Away(FakeCreateMany):
        def _fail_exc(self, requests: Sequence[Any]) -> Exception:
            return DatabaseUnavailable("database unavailable: gone")

    gate = asyncio.Event()
    create_many = Away(gate=gate, fail_when=lambda requests: True)
    coalescer = CreateCoalescer(create_many, max_in_flight=1, max_batch=1000)
    tasks = [asyncio.create_task(coalescer.create(str(i))) for i in range(3)]  # type: ignore[arg-type]
    await asyncio.sleep(0)
    gate.set()
    for outcome in await asyncio.gather(*tasks, return_exceptions=True):
        assert isinstance(outcome, DatabaseUnavailable)
    assert len(create_many.calls) == 2  # no retry one by one: the database is away for all


async def test_a_caller_that_goes_away_does_not_disturb_the_others() -> None:
    gate = asyncio.Event()
    create_many = FakeCreateMany(gate=gate)
    coalescer = CreateCoalescer(create_many, max_in_flight=1, max_batch=1000)
    first = asyncio.create_task(coalescer.create("a"))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    leaving = asyncio.create_task(coalescer.create("b"))  # type: ignore[arg-type]
    staying = asyncio.create_task(coalescer.create("c"))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    leaving.cancel()
    gate.set()
    assert await first == "done:a"
    assert await staying == "done:c"
    with pytest.raises(asyncio.CancelledError):
        await leaving
