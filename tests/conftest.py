"""Fixtures shared by every test that touches PostgreSQL.

One embedded PostgreSQL 18 server per test session; the schema is migrated once into a template
database, and every test gets its own database cloned from it (CREATE DATABASE ... TEMPLATE takes
milliseconds), so tests never see each other's rows and need no cleanup.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from notify_queue.devcluster import ControlPlaneUnavailable, LocalControlPlane, find_bin_dir
from notify_queue.embedded import EmbeddedPostgres
from notify_queue.repositories.db import Database
from notify_queue.repositories.schema import migrate
from tests.support import missing_component

# The product's processes as fixtures (tests/processes.py).
pytest_plugins = ["tests.processes"]

_TEMPLATE = "nq_template"
_counter = itertools.count()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[EmbeddedPostgres]:
    # A directory of its own, not pytest's tmp_path: pytest prunes old tmp directories of other
    # runs, and a concurrent run must never delete this server's data under it.
    root = Path(tempfile.mkdtemp(prefix="notify-queue-pg-"))
    server = EmbeddedPostgres(root / "data", delete_on_stop=True)
    with psycopg.connect(server.url(), autocommit=True) as conn:
        # Durability is not what these tests check; speed is welcome. Reloadable settings only.
        conn.execute("ALTER SYSTEM SET fsync = off")
        conn.execute("ALTER SYSTEM SET synchronous_commit = off")
        conn.execute("SELECT pg_reload_conf()")
        conn.execute(f"DROP DATABASE IF EXISTS {_TEMPLATE}")
        conn.execute(f"CREATE DATABASE {_TEMPLATE}")

    async def prepare() -> None:
        async with Database(server.url(_TEMPLATE), pool_size=1) as db:
            await migrate(db)

    asyncio.run(prepare())
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


@contextmanager
def cloned_database(pg_server: EmbeddedPostgres, prefix: str = "t") -> Iterator[str]:
    """A new database cloned from the migrated template; dropped afterwards."""
    name = f"{prefix}_{os.getpid()}_{next(_counter)}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {_TEMPLATE}")
    try:
        yield pg_server.url(name)
    finally:
        with psycopg.connect(pg_server.url(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def database_url(pg_server: EmbeddedPostgres) -> Iterator[str]:
    with cloned_database(pg_server) as url:
        yield url


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    async with Database(database_url, pool_size=20) as database:
        yield database


@pytest.fixture
def project_root() -> Path:
    return Path(__file__).resolve().parent.parent


# One local control plane (etcd + kube-apiserver, `notify_queue.devcluster`) for the whole session,
# with the CRDs installed, shared by the operator, upgrade and Citus operator tests; skipped, with
# the command to run, when the binaries are not built.
@pytest.fixture(scope="session")
def control_plane() -> Iterator[LocalControlPlane]:
    try:
        bin_dir = find_bin_dir()
    except ControlPlaneUnavailable as exc:
        missing_component("kubernetes binaries", str(exc))
    # A directory of our own rather than pytest's basetemp: pytest prunes old basetemps, and a
    # concurrent pytest run pruning this one would pull etcd's data from under it.
    directory = Path(tempfile.mkdtemp(prefix="notify-queue-k8s-"))
    cluster = LocalControlPlane(
        directory, bin_dir=bin_dir, users={"viewer": ["notify-queue-viewers"]}
    )
    try:
        cluster.start()
        cluster.install_crds()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)
