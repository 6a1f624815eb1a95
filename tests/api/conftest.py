"""Fixtures of the API tests: the app over a migrated database, reached through httpx.

Most tests talk HTTP to the ASGI app in-process (httpx's ASGITransport) with the app's lifespan
run as a server runs it; the tests that need a real socket start uvicorn themselves. `client`
gives each test a fresh database; `shared_client` shares one database per module, for tests
whose requests cannot see each other (unique idempotency keys, no counts), which saves the
database clone per test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from notify_queue.embedded import EmbeddedPostgres
from notify_queue.repositories.db import Database
from tests.api.support import api_client
from tests.conftest import cloned_database


@pytest.fixture
async def client(database_url: str, db: Database) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(database_url, db=db) as http:
        yield http


@pytest.fixture(scope="module")
def shared_database_url(pg_server: EmbeddedPostgres) -> Iterator[str]:
    with cloned_database(pg_server, "api_shared") as url:
        yield url


@pytest.fixture
async def shared_client(shared_database_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(shared_database_url) as http:
        yield http
