"""Fixtures of the product's processes as a user runs them, shared by the tests that drive a real
API and real workers (registered in tests/conftest.py; a test module's own fixture of the same
name takes precedence)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from tests.chaos.harness import WorkerProcesses
from tests.support import running_api


@pytest.fixture
def workers(database_url: str, tmp_path: Path) -> Iterator[WorkerProcesses]:
    """Worker processes the test starts with its own arguments; all stopped at the end."""
    procs = WorkerProcesses(database_url, tmp_path)
    yield procs
    procs.close()


@pytest.fixture
async def api(database_url: str, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """A `notify-queue api` process without a token, and a client of it."""
    async with (
        running_api(database_url, tmp_path / "api.log") as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=30) as http,
    ):
        yield http
