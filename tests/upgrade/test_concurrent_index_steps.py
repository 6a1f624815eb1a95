"""Steps headed `-- transaction: none` (the queue's index builds, CREATE INDEX CONCURRENTLY): run
outside a transaction, recorded once every index is valid, and resumed after an interruption by
dropping the INVALID index the broken build left and building it again (docs/upgrading.md, "Index
builds on the queue")."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from notify_queue.repositories.db import Database
from notify_queue.repositories.schema import _concurrent_indexes_of, migrate


def _rows(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(query, params or None).fetchall()


_INDEX = """SELECT i.indexrelid::bigint, i.indisvalid, pg_get_indexdef(i.indexrelid)
            FROM pg_index i WHERE i.indexrelid = to_regclass(%s)"""


async def test_an_index_left_invalid_by_an_interrupted_build_is_dropped_and_built_again(
    empty_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = empty_database_url
    async with Database(url, pool_size=1) as db:
        await migrate(db)
    [(oid, valid, definition)] = _rows(url, _INDEX, "nq_jobs_waiting")
    assert valid and "waiting_reason" in definition
    # What a migrate killed during 0010's first build leaves: the index there but INVALID (as
    # CREATE INDEX CONCURRENTLY leaves it when cut short), and the step not recorded.
    _rows(url, "UPDATE pg_index SET indisvalid = false WHERE indexrelid = %s::oid RETURNING 1", oid)
    _rows(url, "DELETE FROM nq_schema_steps WHERE version = 10 RETURNING 1")

    async with Database(url, pool_size=1) as db:
        assert await migrate(db) == [10]
    [(rebuilt, valid, definition_after)] = _rows(url, _INDEX, "nq_jobs_waiting")
    assert valid and rebuilt != oid and definition_after == definition
    assert "left invalid by an interrupted build" in caplog.text
    # The other index of the step was valid: kept as it was, not built again.
    assert _rows(url, _INDEX, "nq_jobs_digest")[0][1] is True
    assert _rows(url, "SELECT release FROM nq_schema_steps WHERE version = 10")


def test_a_step_outside_a_transaction_holds_concurrent_index_builds_only() -> None:
    header = "-- transaction: none\n-- why\n"
    built = _concurrent_indexes_of(
        header + "CREATE INDEX CONCURRENTLY IF NOT EXISTS nq_x ON nq_jobs (a) WHERE b = 'c';\n"
        "-- the second\nCREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS nq_y ON nq_jobs (d);\n",
        "0099_x.sql",
    )
    assert [name for name, _ in built] == ["nq_x", "nq_y"]
    assert _concurrent_indexes_of("-- phase: expand\nCREATE TABLE t (a int);", "0099_x.sql") == ()
    for body in (
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS nq_x ON nq_jobs (a);\nCREATE TABLE t (a int);",
        # Without IF NOT EXISTS a rerun after a build that finished unrecorded would fail.
        "CREATE INDEX CONCURRENTLY nq_x ON nq_jobs (a);",
        "CREATE INDEX nq_x ON nq_jobs (a);",
    ):
        with pytest.raises(ValueError, match="holds only concurrent index builds"):
            _concurrent_indexes_of(header + body, "0099_x.sql")
    with pytest.raises(ValueError, match="unknown transaction header"):
        _concurrent_indexes_of("-- transaction: maybe\nSELECT 1;", "0099_x.sql")
