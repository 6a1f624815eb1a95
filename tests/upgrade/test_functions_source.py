"""The schema's functions are source code (repositories/functions/, repositories/schema.py
"Functions"): a database upgraded from each earlier release ends with the same functions, text for
text, as a new one, and no migration defines a function of today's schema.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import psycopg
import pytest

from notify_queue.embedded import EmbeddedPostgres
from notify_queue.repositories.db import Database
from notify_queue.repositories.schema import MIGRATIONS_PACKAGE, function_sources, migrate
from tests.conftest import cloned_database
from tests.upgrade.baseline import BASELINES, Baseline, baseline_venv
from tests.upgrade.support import Release

# Every function of the schema, its identity and its whole definition (owner's rights included).
FUNCTIONS = """
SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')' AS function,
       pg_get_functiondef(p.oid) AS definition, p.proacl::text AS rights
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = current_schema() AND p.prokind = 'f'
ORDER BY 1
"""
_DEFINES = re.compile(r"^\s*CREATE\s+(OR\s+REPLACE\s+)?FUNCTION\s+(\w+)", re.I | re.M)
# History, not today's schema: 0.1.0's trigger functions and retry (the baseline, 0008), and
# those 0009 keeps for 0.1.0's triggers and view until the contract step 0015 drops them.
_HISTORY = {
    "nq_status_outbox_capture",
    "nq_count_changes",
    "nq_explicit_session",
    "nq_delivery_log_retry",
    "nq_queue_move_finished",
    "nq_jobs_fill_bucket",
}


def _functions(url: str) -> list[tuple[str, str, str]]:
    with psycopg.connect(url) as conn:
        return [(r[0], r[1], r[2]) for r in conn.execute(FUNCTIONS).fetchall()]


async def _fresh(url: str) -> list[tuple[str, str, str]]:
    async with Database(url, pool_size=1) as db:
        await migrate(db)
    return _functions(url)


@pytest.mark.parametrize("baseline", BASELINES, ids=lambda b: f"from-{b.release}")
async def test_a_database_upgraded_from_a_release_has_the_functions_of_a_new_one(
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
    upgraded = _functions(url)

    with cloned_database(pg_server, prefix="fresh") as fresh_url:
        with psycopg.connect(fresh_url, autocommit=True) as conn:
            # The template is migrated; start from nothing, as a new installation does.
            conn.execute("DROP SCHEMA public CASCADE")
            conn.execute("CREATE SCHEMA public")
        fresh = await _fresh(fresh_url)

    assert [f for f, _, _ in upgraded] == [f for f, _, _ in fresh]
    assert upgraded == fresh


def test_no_migration_defines_a_function_of_todays_schema() -> None:
    defined: dict[str, set[int]] = {}
    for entry in resources.files(MIGRATIONS_PACKAGE).iterdir():
        if entry.name.endswith(".sql"):
            for match in _DEFINES.finditer(entry.read_text("utf-8")):
                defined.setdefault(match[2], set()).add(int(entry.name[:4]))
    today = set(function_sources())
    # 0.1.0's signature of nq_insert_webhook_events (the baseline), which 0.1.0's triggers call
    # until 0015.
    assert defined.pop("nq_insert_webhook_events") == {8}
    assert not defined.keys() & today
    assert defined.keys() <= _HISTORY
    assert not today & _HISTORY


def test_every_function_file_defines_the_function_it_is_named_after() -> None:
    for name, text in function_sources().items():
        assert [m[2] for m in _DEFINES.finditer(text)] == [name], name
