"""The enqueue finds the keys it brings by the key's index on a young table (migration 0037).

nq_enqueue_pending keeps its statement's plan for the connection's life. Once autovacuum has
analysed the keys table at its first few hundred rows (its threshold is 50 rows), the planner
costs reading those few pages whole below probing the index for the 100 keys it assumes a batch
brings, and that plan stayed while the table grew to tens of thousands of keys, every statement
of a burst reading them all (docs/performance.md, "The single-create leg and the enqueue's
plan"). Counted from pg_stat_user_tables, never timed; the negative control is the function
without its setting.
"""

from __future__ import annotations

from typing import Any

import psycopg

from notify_queue.repositories.db import Database
from tests.support import new, notification_service, statistics_count

ANALYSED_AT = 60
STATEMENTS = 12
PER_STATEMENT = 30
KEY_TABLE_SCANS = "SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'nq_idempotency_keys'"


async def _key_table_scans(database_url: str) -> int:
    """Whole reads of the keys table while one connection enqueues statements of a few
    creates each into a new installation, as a burst of single creates does, after the
    analysis autovacuum makes of its first rows."""
    async with Database(database_url, pool_size=1, name="notify-queue-api") as db:
        service = notification_service(db, announce=False)
        await service.enqueue_many([new() for _ in range(ANALYSED_AT)])
        observer: Any
        async with await psycopg.AsyncConnection.connect(database_url) as observer:
            await observer.execute("ANALYZE nq_idempotency_keys")
        before = await statistics_count(db, database_url, KEY_TABLE_SCANS)
        for _ in range(STATEMENTS):
            results = await service.enqueue_many([new() for _ in range(PER_STATEMENT)])
            assert all(r.created for r in results)
        return await statistics_count(db, database_url, KEY_TABLE_SCANS) - before


async def test_the_enqueue_reads_keys_by_index_on_a_new_table(database_url: str) -> None:
    assert await _key_table_scans(database_url) == 0


async def test_without_its_setting_the_enqueue_reads_the_key_table_whole(
    database_url: str,
) -> None:
    conn: Any
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        # The API's batch calls nq_enqueue_pending_v2 (the suppression probe), which calls
        # nq_enqueue_pending: both carry the setting.
        for function in ("nq_enqueue_pending", "nq_enqueue_pending_v2"):
            await conn.execute(
                f"ALTER FUNCTION {function}(json, integer, boolean) RESET enable_seqscan"
            )
    assert await _key_table_scans(database_url) > 0
