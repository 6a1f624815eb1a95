"""Schema migrations and life with a database that is missing, late or restarted."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import psycopg

from notify_queue.embedded import EmbeddedPostgres
from notify_queue.repositories.db import Database
from notify_queue.repositories.schema import (
    available_migrations,
    current_version,
    latest_version,
    migrate,
)
from tests.support import directory_outside_pytest, eventually, new, notification_service


def _fresh_database(pg_server: EmbeddedPostgres, name: str) -> str:
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    return pg_server.url(name)


async def test_migrating_twice_changes_nothing_the_second_time(pg_server: EmbeddedPostgres) -> None:
    url = _fresh_database(pg_server, "mig_twice")
    async with Database(url, pool_size=1) as db:
        assert await current_version(db) is None
        # Every migration shipped, in order (numbers are reserved per branch, so gaps may exist).
        assert await migrate(db) == [m.version for m in available_migrations()]
        assert await migrate(db) == []
        assert await current_version(db) == latest_version()


async def test_migrations_run_from_several_processes_at_once_apply_each_version_once(
    pg_server: EmbeddedPostgres,
) -> None:
    url = _fresh_database(pg_server, "mig_parallel")
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "notify_queue",
            "migrate",
            "--database-url",
            url,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(4)
    ]
    results = await asyncio.gather(*(p.communicate() for p in procs))
    assert [p.returncode for p in procs] == [0, 0, 0, 0], results
    async with Database(url, pool_size=1) as db:
        rows = await db.fetch_all("migration_versions")
    assert sorted(r["version"] for r in rows) == [m.version for m in available_migrations()]


def test_a_database_that_is_down_at_start_gives_one_line_and_a_non_zero_exit() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "notify_queue",
            "worker",
            "--database-url",
            "postgresql://nq@127.0.0.1:9/nq",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert (
        len(lines) == 1 and "database unavailable" in lines[0] and "Traceback" not in result.stderr
    )


def test_a_bad_setting_gives_one_line_naming_the_flag() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "notify_queue",
            "worker",
            "--database-url",
            "postgresql://x@/y",
            "--priorities",
            "URGENT",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "--priorities" in result.stderr


async def test_the_pool_reconnects_after_the_database_restarts() -> None:
    with directory_outside_pytest("notify-queue-pg-reconnect-") as root:
        server = EmbeddedPostgres(root / "pg", delete_on_stop=True)
        try:
            url = server.url()
            async with Database(url, pool_size=2) as db:
                await migrate(db)
                await notification_service(db).enqueue(new())
                server.halt(mode="fast")
                server.resume()
                # The first use after the restart may fail (its connection died); then it recovers.
                created = await eventually(lambda: _try_enqueue(db), timeout=20, interval=0.2)
                assert created
        finally:
            server.stop()


async def _try_enqueue(db: Database) -> bool:
    from notify_queue.errors import DatabaseUnavailable

    try:
        await notification_service(db).enqueue(new())
        return True
    except DatabaseUnavailable:
        return False
