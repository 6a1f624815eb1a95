"""Fixtures of the chaos tests: the provider and webhook receiver on loopback, worker
subprocesses that are always cleaned up, and a PostgreSQL server of their own for the tests
that stop it.

The session's shared server (tests/conftest.py) runs with fsync and synchronous_commit off for
speed; a test that crashes PostgreSQL must not use it, because with synchronous_commit off a
crash may lose the last commits by design. `restartable_pg` is a server with PostgreSQL's
durable defaults, stopped and started by the tests that use it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest

from notify_queue.embedded import EmbeddedPostgres
from notify_queue.repositories.db import Database
from notify_queue.repositories.schema import migrate
from tests.chaos.harness import WEBHOOK_SECRET, WorkerProcesses
from tests.chaos.peers import ChaosProvider, SignedWebhookReceiver
from tests.support import directory_outside_pytest


@pytest.fixture
async def provider() -> AsyncIterator[ChaosProvider]:
    server = await ChaosProvider().start()
    yield server
    await server.stop()


@pytest.fixture
async def receiver() -> AsyncIterator[SignedWebhookReceiver]:
    server = await SignedWebhookReceiver(WEBHOOK_SECRET).start()
    yield server
    await server.stop()


@pytest.fixture
def worker_processes(tmp_path: Path) -> Iterator[list[WorkerProcesses]]:
    """A place to register `WorkerProcesses`; every process group still alive is killed after."""
    registry: list[WorkerProcesses] = []
    yield registry
    for group in registry:
        group.close()


@pytest.fixture
def spawn(worker_processes: list[WorkerProcesses], tmp_path: Path):  # type: ignore[no-untyped-def]
    """`spawn(database_url, *flags)` -> WorkerProcesses whose processes die with the test."""

    def make(database_url: str, *flags: str) -> WorkerProcesses:
        group = WorkerProcesses(database_url, tmp_path, *flags)
        worker_processes.append(group)
        return group

    return make


@pytest.fixture(scope="module")
def restartable_pg() -> Iterator[EmbeddedPostgres]:
    with directory_outside_pytest("notify-queue-pg-restart-") as root:
        server = EmbeddedPostgres(root / "data", delete_on_stop=True)
        try:
            yield server
        finally:
            with contextlib.suppress(Exception):
                server.resume()  # a test that failed while the server was down leaves it stopped
            server.stop()


@pytest.fixture
async def restartable_db(restartable_pg: EmbeddedPostgres) -> AsyncIterator[Database]:
    """A fresh, migrated database on `restartable_pg` (durable settings, see the module doc)."""
    with psycopg.connect(restartable_pg.url(), autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS chaos_restart WITH (FORCE)")
        conn.execute("CREATE DATABASE chaos_restart")
        durable = conn.execute("SHOW synchronous_commit").fetchone()
        assert durable is not None and durable[0] == "on"
    async with Database(restartable_pg.url("chaos_restart"), pool_size=4) as database:
        await migrate(database)
        yield database
