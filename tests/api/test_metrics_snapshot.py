"""What /metrics costs the database: one read of the queue's figures per refresh window.

Every statement the repositories send is counted by name at their one connection class, while
the app serves scrapes: one scrape is one read (its statements); 48 scrapes at once within
the window are still one read; a scrape after the window reads again. The window is a setting
(`--metrics-refresh-seconds`); here it is long, so the scrapes are surely inside it, and then
short, so the next one is surely outside it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from notify_queue.repositories.db import Connection, Database
from tests.api.support import api_client, create, email


class Statements:
    """The named statements the app sent, in order."""

    def __init__(self) -> None:
        self.names: list[str] = []

    async def during(self, action: Callable[[], Awaitable[Any]]) -> Counter[str]:
        before = len(self.names)
        await action()
        return Counter(self.names[before:])


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[Statements]:
    """Every statement of the repositories goes through `Connection`'s four calls by name."""
    sent = Statements()
    for method in ("execute", "fetch_one", "fetch_all", "fetch_named"):
        real = getattr(Connection, method)

        async def counted(self: Any, query: str, *args: Any, _real: Any = real, **kw: Any) -> Any:
            sent.names.append(query)
            return await _real(self, query, *args, **kw)

        monkeypatch.setattr(Connection, method, counted)
    yield sent


READ = {"queue_status_counts", "queue_status_due", "queue_status_webhooks", "queue_status_waiting"}


async def test_a_scrape_reads_the_queue_and_48_more_at_once_read_nothing(
    database_url: str, db: Database, statements: Statements
) -> None:
    async with api_client(database_url, db=db, metrics_refresh_seconds=3600) as http:
        await create(http, email(body="counted"))

        async def one() -> None:
            assert (await http.get("/metrics")).status_code == 200

        async def many() -> None:
            answers = await asyncio.gather(*(http.get("/metrics") for _ in range(48)))
            assert {a.status_code for a in answers} == {200}

        first = await statements.during(one)
        assert READ <= set(first) and sum(first.values()) >= 6
        assert await statements.during(many) == Counter()  # served from the first read


async def test_48_concurrent_first_scrapes_share_one_read(
    database_url: str, db: Database, statements: Statements
) -> None:
    async with api_client(database_url, db=db, metrics_refresh_seconds=3600) as http:
        answers: list[Any] = []

        async def many() -> None:
            answers.extend(await asyncio.gather(*(http.get("/metrics") for _ in range(48))))

        sent = await statements.during(many)
    assert READ <= set(sent)
    assert set(sent.values()) == {1}, sent  # each statement once: one read for 48 scrapes
    assert {a.status_code for a in answers} == {200}
    oldest = {
        tuple(line for line in a.text.splitlines() if line.startswith("notify_queue_oldest"))
        for a in answers
    }
    assert len(oldest) == 1  # every scraper got the same snapshot


async def test_a_scrape_after_the_window_reads_the_queue_again(
    database_url: str, db: Database, statements: Statements
) -> None:
    async with api_client(database_url, db=db, metrics_refresh_seconds=0.05) as http:
        first = await statements.during(lambda: http.get("/metrics"))
        await create(http, email(body="later"))
        await asyncio.sleep(0.1)  # past the window: what is asserted is the read, not a time
        again = await statements.during(lambda: http.get("/metrics"))
        assert READ <= set(first) and READ <= set(again)
        text = (await http.get("/metrics")).text
    assert 'notify_queue_notifications{status="PENDING"} 1.0' in text
