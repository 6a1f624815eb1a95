"""0.1.0's steps squashed into one, 0.2.0's into four (docs/upgrading.md, "The history squashed"): a
database that 0.2.0 migrated is recognised by the steps it recorded and gets only what came after,
its contract steps done or not; one that a build between two releases migrated part way is
refused with the release to upgrade through, and nothing changes. Both upgrades from a release
end with the schema of a new installation, `pg_dump --schema-only` for `pg_dump --schema-only`."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from notify_queue.embedded import EmbeddedPostgres, bin_dir
from notify_queue.errors import UpgradeThroughRelease
from notify_queue.repositories.db import Database
from notify_queue.repositories.schema import SQUASHED, migrate, missing_steps
from tests.upgrade.baseline import BASELINES, Baseline, baseline_venv
from tests.upgrade.support import Release

# 0.2.0's steps as a database that 0.2.0 migrated recorded them (its tree at f73ba7e).
RELEASE_0_2_0_EXPAND = {
    11: "keys_across_retention", 12: "jobs", 16: "enqueue_function", 17: "waiting",
    19: "digests", 20: "escalations", 21: "citus_every_role", 23: "drain_cost",
    24: "enqueue_pending", 25: "jobs_fillfactor", 26: "jobs_pending_created",
    28: "delivery_log_unsent", 30: "finish_held", 32: "request_hash_keys", 35: "request_digest",
    37: "enqueue_index_plans", 38: "forget_final_keys", 39: "finish_results",
    40: "give_back_places", 41: "complete_deliveries", 42: "claim_functions",
    43: "delivery_log_replica_identity",
}  # fmt: skip
RELEASE_0_2_0_CONTRACT = {
    13: "jobs_contract", 14: "jobs_unfinished", 27: "jobs_created_contract",
    29: "delivery_log_unsent_contract", 31: "finish_held_contract",
    33: "request_hash_keys_contract", 34: "enqueue_keys_plain", 36: "request_digest_contract",
}  # fmt: skip
SQUASH_STEPS = [9, 10, 15, 22]


def _execute(url: str, *statements: tuple[str, tuple[object, ...]]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for query, params in statements:
            conn.execute(query, params)


def _versions(url: str) -> list[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT version FROM nq_schema_steps ORDER BY 1")]


def _record(url: str, steps: dict[int, str], phase: str) -> None:
    _execute(
        url,
        *(
            (
                "INSERT INTO nq_schema_steps (version, name, phase, release)"
                " VALUES (%s, %s, %s, '0.2.0')",
                (version, name, phase),
            )
            for version, name in steps.items()
        ),
    )


def test_the_ledger_names_0_2_0s_last_steps_as_0_2_0_recorded_them() -> None:
    squash = next(s for s in SQUASHED if s.release == "0.2.0")
    assert squash.last_expand == (43, RELEASE_0_2_0_EXPAND[43])
    assert squash.last_contract == (36, RELEASE_0_2_0_CONTRACT[36])
    assert max(RELEASE_0_2_0_EXPAND | RELEASE_0_2_0_CONTRACT) in squash.steps


async def test_a_database_0_2_0_migrated_gets_the_squashed_steps_as_applied(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    async with Database(url, pool_size=1) as db:
        await migrate(db)
        # The ledger of a 0.2.0 database, expand and contract steps done: nothing to apply.
        _execute(url, ("DELETE FROM nq_schema_steps WHERE version = ANY(%s)", (SQUASH_STEPS,)))
        _record(url, RELEASE_0_2_0_EXPAND, "expand")
        _record(url, RELEASE_0_2_0_CONTRACT, "contract")
        assert await missing_steps(db) == []
        assert await migrate(db, contract=True) == []
        # Stopped part way through 0.2.0's contract steps: the squashed ones run, over what is
        # already gone, and change nothing that is there.
        _execute(url, ("DELETE FROM nq_schema_steps WHERE version IN (29, 31, 33, 34, 36)", ()))
        assert await migrate(db) == []
        assert await migrate(db, contract=True) == [15, 22]
    assert set(_versions(url)) >= {15, 22, 43}


async def test_a_database_migrated_part_way_to_0_2_0_is_told_to_upgrade_through_it(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    async with Database(url, pool_size=1) as db:
        await migrate(db, target=8)
        _record(url, {11: "keys_across_retention", 12: "jobs"}, "expand")
        message = (
            "this database applied 2 of 0.2.0's migration steps (0011 to 0012) but not its last, "
            "0043_delivery_log_replica_identity: a build between two releases migrated it. Run "
            "0.2.0's `notify-queue migrate` on it first, then this release's"
        )
        with pytest.raises(UpgradeThroughRelease, match=re.escape(message)):
            await migrate(db)
    assert _versions(url) == [11, 12]
    # The command an operator runs: exit 1 and that one line, nothing applied.
    refused = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "notify_queue", "migrate", "--database-url", url],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 1
    assert message in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert _versions(url) == [11, 12]


async def test_a_database_part_way_to_0_1_0_is_told_to_upgrade_through_it(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    async with Database(url, pool_size=1) as db:
        await migrate(db, target=8)
        _execute(
            url,
            ("DELETE FROM nq_schema_migrations", ()),
            ("INSERT INTO nq_schema_migrations (version, name) VALUES (1, 'initial')", ()),
        )
        with pytest.raises(UpgradeThroughRelease, match=r"1 of 0\.1\.0's migration steps"):
            await migrate(db)
        # Readiness names the step it lacks.
        assert (await missing_steps(db))[0] == "0008_release_0_1_0"


def _schema(url: str) -> list[str]:
    """`pg_dump --schema-only` as a sorted list of its objects, the log's daily partitions left
    out (each database has the days around its own history)."""
    dump = subprocess.run(
        [str(bin_dir() / "pg_dump"), "--schema-only", "--no-owner", "-d", url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    text = "\n".join(line for line in dump.splitlines() if not line.startswith("\\"))
    objects = (block.strip() for block in re.split(r"\n--\n-- ", text))
    return sorted(o for o in objects if not re.search(r"nq_delivery_log_(before_)?\d{8}", o))


@pytest.mark.parametrize("baseline", BASELINES, ids=lambda b: f"from-{b.release}")
async def test_an_upgraded_database_has_the_schema_of_a_new_one(
    baseline: Baseline, empty_database_url: str, pg_server: EmbeddedPostgres, tmp_path: Path
) -> None:
    url = empty_database_url
    old = Release(baseline.release, baseline_venv(baseline) / "bin" / "python", url, tmp_path)
    # 0.1.0 has no contract steps; a later release's own contract steps run first.
    installed = (
        old.run("migrate") if baseline.release == "0.1.0" else old.run("migrate", "--contract")
    )
    assert installed.returncode == 0, installed.stderr
    async with Database(url, pool_size=1) as db:
        await migrate(db)
        await migrate(db, contract=True)
    # A new installation: a database made as the upgraded one was, migrated once.
    name = f"fresh_{uuid.uuid4().hex[:8]}"
    _execute(pg_server.url(), (f"CREATE DATABASE {name}", ()))
    try:
        async with Database(pg_server.url(name), pool_size=1) as db:
            await migrate(db)
        fresh = _schema(pg_server.url(name))
    finally:
        _execute(pg_server.url(), (f"DROP DATABASE {name} WITH (FORCE)", ()))
    upgraded = _schema(url)
    assert [o.splitlines()[0] for o in upgraded] == [o.splitlines()[0] for o in fresh]
    assert upgraded == fresh
