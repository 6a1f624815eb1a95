"""How `migrate` records and phases its steps (docs/upgrading.md), on a test-only migrations
package with a contract step (tests/upgrade/contract_migrations): the baseline stays where 0.1.0
reads it, plain `migrate` applies expand steps only, `migrate --contract` refuses while a process
of an older release is connected, a fresh database gets every step at once, and readiness asks
for the steps this release needs and no more; a step that cannot get its locks from the running
processes' transactions is run again, not failed."""

from __future__ import annotations

import asyncio
import logging

import psycopg
import pytest

from notify_queue import __version__
from notify_queue.errors import DatabaseBusy, OlderReleaseRunning
from notify_queue.repositories import schema
from notify_queue.repositories.db import Database, application_name
from notify_queue.repositories.schema import (
    BASELINE_VERSION,
    Phase,
    available_migrations,
    migrate,
    missing_steps,
    release_of,
)
from tests.support import eventually

DEMO = "tests.upgrade.contract_migrations"


def _rows(url: str, query: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return list(conn.execute(query).fetchall())


def _columns(url: str) -> set[str]:
    return {
        str(r[0])
        for r in _rows(
            url, "SELECT column_name FROM information_schema.columns WHERE table_name = 'nq_demo'"
        )
    }


def test_a_file_is_an_expand_step_unless_its_leading_comments_say_contract() -> None:
    phases = {m.version: m.phase for m in available_migrations(DEMO)}
    assert phases == {1: Phase.EXPAND, 9: Phase.EXPAND, 10: Phase.CONTRACT, 11: Phase.EXPAND}
    # 0.2.0's contract steps, squashed: what only 0.1.0 used, the queue's order index every claim
    # wrote to, the log's status index every completion wrote to (0015), and the check that the
    # queue holds unfinished rows only, validated in a transaction of its own (0022).
    contract = {m.version for m in available_migrations() if m.phase is Phase.CONTRACT}
    assert contract == {15, 22}


async def test_the_shipped_migrations_leave_the_baseline_ledger_at_eight_for_0_1_0(
    empty_database_url: str,
) -> None:
    # 0.1.0's /readyz answers 503 unless max(version) here is exactly 8, and its operator refuses
    # to start below 8: later steps must never be recorded in this table.
    async with Database(empty_database_url, pool_size=1) as db:
        await migrate(db)
        assert await missing_steps(db) == []
    assert _rows(empty_database_url, "SELECT max(version) FROM nq_schema_migrations") == [
        (BASELINE_VERSION,)
    ]


async def test_a_fresh_database_gets_every_step_at_once_contract_included(
    empty_database_url: str,
) -> None:
    async with Database(empty_database_url, pool_size=1) as db:
        assert await migrate(db, package=DEMO) == [1, 9, 10, 11]
        assert await migrate(db, package=DEMO) == []
    assert _columns(empty_database_url) == {"id", "new_name"}
    assert _rows(empty_database_url, "SELECT version FROM nq_schema_migrations") == [(1,)]
    assert _rows(
        empty_database_url, "SELECT version, phase, release FROM nq_schema_steps ORDER BY version"
    ) == [(9, "expand", __version__), (10, "contract", __version__), (11, "expand", __version__)]


async def test_migrate_applies_expand_steps_and_leaves_the_contract_step_for_later(
    empty_database_url: str,
) -> None:
    async with Database(empty_database_url, pool_size=1) as db:
        assert await migrate(db, package=DEMO, target=1) == [1]  # the previous release's schema
        assert await migrate(db, package=DEMO) == [9, 11]
        assert await migrate(db, package=DEMO) == []
    assert _columns(empty_database_url) == {"id", "old_name", "new_name"}


async def test_contract_refuses_while_a_process_of_an_older_release_is_connected(
    empty_database_url: str,
) -> None:
    async with Database(empty_database_url, pool_size=1) as db:
        await migrate(db, package=DEMO, target=1)
        await migrate(db, package=DEMO)
        # A 0.1.0 worker: its connections carry the role's name and no release.
        with psycopg.connect(empty_database_url, application_name="notify-queue-worker"):
            with pytest.raises(OlderReleaseRunning, match=r"notify-queue-worker \(1\)"):
                await migrate(db, package=DEMO, contract=True)
            assert "old_name" in _columns(empty_database_url)
        # Processes of this release, and other programs, are no reason to wait.
        with (
            psycopg.connect(
                empty_database_url, application_name=application_name("notify-queue-api-1")
            ),
            psycopg.connect(empty_database_url, application_name="psql"),
        ):
            assert await migrate(db, package=DEMO, contract=True) == [10]
    assert _columns(empty_database_url) == {"id", "new_name"}


async def test_readiness_asks_for_this_releases_expand_steps_and_accepts_newer_ones(
    empty_database_url: str,
) -> None:
    async with Database(empty_database_url, pool_size=1) as db:
        assert await missing_steps(db, package=DEMO) == [
            "0001_demo",
            "0009_demo_new_name",
            "0011_demo_index",
        ]
        await migrate(db, package=DEMO, target=1)
        assert await missing_steps(db, package=DEMO) == ["0009_demo_new_name", "0011_demo_index"]
        await migrate(db, package=DEMO)
        # The contract step is pending: the code of its release works before and after it.
        assert await missing_steps(db, package=DEMO) == []
        # The next release's `migrate` ran (a step this code does not know): still ready.
        _rows(
            empty_database_url,
            "INSERT INTO nq_schema_steps (version, name, phase, release)"
            " VALUES (12, 'next_release', 'expand', '0.3.0') RETURNING version",
        )
        assert await missing_steps(db, package=DEMO) == []


def test_a_connection_name_without_a_release_is_0_1_0s() -> None:
    assert release_of("notify-queue-api-12") == (0, 1, 0)
    assert release_of(application_name("notify-queue-listen")) == release_of("@" + __version__)
    assert release_of("notify-queue-worker@0.10.2") > release_of("notify-queue-worker@0.9.7")


@pytest.mark.parametrize("attempts", [schema.LOCK_ATTEMPTS, 1])
async def test_a_step_that_waits_on_a_running_transaction_is_run_again_once_it_ends(
    empty_database_url: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    attempts: int,
) -> None:
    # A reader of the previous release holds its table in a transaction (ACCESS SHARE) past the
    # step's lock timeout; it commits only once the migrator has given up a first time, so the
    # order of events is fixed, not timed. With one attempt (the negative control: no retry),
    # migrate fails as it did when 0.1.0's transactions deadlocked with it.
    monkeypatch.setattr(schema, "LOCK_ATTEMPTS", attempts)
    caplog.set_level(logging.WARNING, logger="notify_queue.repositories.schema")
    async with Database(empty_database_url, pool_size=1) as db:
        await migrate(db, package=DEMO, target=1)
        async with await psycopg.AsyncConnection.connect(empty_database_url) as reader:
            await reader.execute("LOCK TABLE nq_demo IN ACCESS SHARE MODE")
            migrating = asyncio.create_task(migrate(db, package=DEMO))

            async def gave_up_once() -> bool:
                return migrating.done() or any(
                    "rolled back" in r.getMessage() for r in caplog.records
                )

            await eventually(gave_up_once, timeout=60, what="the step's first lock timeout")
            await reader.commit()
            if attempts == 1:
                with pytest.raises(DatabaseBusy, match="lock timeout"):
                    await migrating
                return
            assert await migrating == [9, 11]
    assert _columns(empty_database_url) == {"id", "old_name", "new_name"}
