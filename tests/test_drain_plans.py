"""The drain's statements are planned once per connection and read every table by key
(docs/performance.md, "The drain's CPU, step by step", steps 7 and 10).

The claim's steps and the completion are functions (functions/*.sql) that carry the drain's plan
settings as attributes: `plan_cache_mode = force_generic_plan`, so PL/pgSQL's plan of each
statement, kept per connection, is the generic one from the first call (PostgreSQL's default makes
five custom plans per connection and statement, and a worker's pool handing out its connections in
turn paid a plan on nearly every call), and `enable_seqscan = off`, so no plan depends on the
statistics it was made with. The calls are prepared at their first run on a connection, where the
client prepares (not at all behind a pooler that keeps no prepared statements). Counted from
`pg_proc` and the connection's own `pg_prepared_statements`, never timed.

A plan kept per connection must not depend on the statistics it was made with (step 10): the
completion finds its rows through the primary key, never through the lease index whose predicate
(status = 'PROCESSING') its status check would match, which on a young queue's statistics the
generic plan took, reading every row in flight to complete a batch (nor through the PENDING
indexes, which a digest item's status check matched in a first draft of 0039); and the
admission reads the recipients' rate windows by key after an ANALYZE that found none, where its
plan read the whole windows table once per recipient. Counted from pg_stat_user_indexes and
pg_stat_user_tables; the negative controls are the old scan's generic plan and the claim's
functions without `enable_seqscan = off`.
"""

from __future__ import annotations

from typing import Any

import psycopg

from notify_queue.models import Channel, Completion, Priority, Status
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery import DeliveryRepository
from tests.support import defaults, new, notification_service, statistics_count, status_counts

CLAIMS = 7
BATCH = 20
SENT_ATTEMPT = '[{"provider": "log", "outcome": "sent", "ms": 1}]'
# A distinctive piece of each call's text, as pg_prepared_statements shows it: a drain of
# address-targeted rows claims in one call (nq_claim) and completes in another
# (nq_complete_deliveries).
STATEMENTS = {
    "claim": "FROM nq_claim_v2(",
    "complete_deliveries": "FROM nq_complete_deliveries(",
}
CLAIM_FUNCTIONS = ("nq_claim_v2", "nq_claim_lock_v2")
DRAIN_SETTINGS = {"enable_seqscan=off", "plan_cache_mode=force_generic_plan"}


async def _backlog(db: Database) -> None:
    """CLAIMS * BATCH due notifications, each its own recipient."""
    await notification_service(db, announce=False).enqueue_many(
        [new() for _ in range(CLAIMS * BATCH)]
    )


async def _drain(db: Database) -> None:
    """CLAIMS claims of BATCH rows, each completed as SENT, on the pool's one connection."""
    await _backlog(db)
    await _drain_backlog(db)


async def _drain_backlog(db: Database) -> None:
    repository = DeliveryRepository(db, defaults(rate_limit=1_000))
    for _ in range(CLAIMS):
        batch = await repository.notifications_claim(
            priorities=list(Priority), channels=list(Channel), limit=BATCH
        )
        assert len(batch.claimed) == BATCH
        recorded = await repository.deliveries_complete(
            completions=[
                Completion(c.id, c.claim_token, Status.SENT, None, None, f"m-{c.id}", "log")
                for c in batch.claimed
            ]
        )
        assert recorded.accepted == {c.id for c in batch.claimed}


async def _unfinished_and_sent(db: Database) -> tuple[int, int]:
    counts = await status_counts(db)
    return counts.get("PENDING", 0) + counts.get("PROCESSING", 0), counts.get("SENT", 0)


async def _plans(db: Database) -> dict[str, int]:
    """How often each drain call prepared on the pool's connection ran (its plans, generic and
    custom: PostgreSQL's choice for a call of a function, whose own statements plan apart)."""
    async with db.connection() as conn:
        # The session's own view: what this connection prepared and how it planned each run.
        raw: Any = conn._conn
        cur = await raw.execute(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
        )
        rows = await cur.fetchall()
    found: dict[str, int] = {}
    for name, marker in STATEMENTS.items():
        for row in rows:
            if marker in row["statement"]:
                found[name] = int(row["generic_plans"]) + int(row["custom_plans"])
    return found


async def test_the_drains_calls_are_prepared_once_per_connection(database_url: str) -> None:
    async with Database(database_url, pool_size=1, name="notify-queue-worker") as db:
        await _drain(db)
        assert await _plans(db) == {name: CLAIMS for name in STATEMENTS}
        assert await _unfinished_and_sent(db) == (0, CLAIMS * BATCH)


async def test_the_drains_functions_carry_its_settings(database_url: str) -> None:
    """Every statement of the claim's steps and of the completion is planned under the drain's
    settings, whoever calls them, in autocommit or in a transaction (0041, 0042)."""
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cur = await conn.execute(
            "SELECT proname, proconfig FROM pg_proc WHERE proname = ANY(%s)",
            ([*CLAIM_FUNCTIONS, "nq_complete_deliveries"],),
        )
        settings = {name: set(config) for name, config in await cur.fetchall()}
    assert settings == {
        name: DRAIN_SETTINGS for name in (*CLAIM_FUNCTIONS, "nq_complete_deliveries")
    }


async def test_without_prepared_statements_the_drain_prepares_nothing(database_url: str) -> None:
    async with Database(
        database_url, pool_size=1, name="notify-queue-worker", prepared_statements=False
    ) as db:
        await _drain(db)
        assert await _plans(db) == {}
        assert await _unfinished_and_sent(db) == (0, CLAIMS * BATCH)


# Scans of the queue's indexes other than its primary key: the lease index (PROCESSING rows) and
# the PENDING ones (claim order, creation order, waiting, expiry), whose predicates a status check
# in the completion would match.
QUEUE_SECONDARY_SCANS = (
    "SELECT sum(idx_scan) FROM pg_stat_user_indexes"
    " WHERE relname = 'nq_jobs' AND indexrelname <> 'nq_jobs_pkey'"
)
WINDOW_TABLE_SCANS = "SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'nq_rate_windows'"


async def test_a_completion_reads_its_rows_by_primary_key_with_claims_in_flight(
    database_url: str,
) -> None:
    async with Database(database_url, pool_size=1, name="notify-queue-worker") as db:
        await _backlog(db)
        repository = DeliveryRepository(db, defaults(rate_limit=1_000))
        in_flight = [
            (
                await repository.notifications_claim(
                    priorities=list(Priority), channels=list(Channel), limit=BATCH
                )
            ).claimed
            for _ in range(CLAIMS)
        ]
        async with await psycopg.AsyncConnection.connect(database_url) as observer:
            # What made the old scan go wrong: the lease index matches a status check, and the
            # generic plan of a young queue prefers it to the primary key.
            cur = await observer.execute(
                "EXPLAIN (GENERIC_PLAN) SELECT id FROM nq_jobs n"
                " WHERE n.id = ANY($1::uuid[]) AND n.status = 'PROCESSING' FOR UPDATE"
            )
            assert "nq_jobs_lease" in "\n".join(r[0] for r in await cur.fetchall())
        before = await statistics_count(db, database_url, QUEUE_SECONDARY_SCANS)
        for claimed in in_flight:
            recorded = await repository.deliveries_complete(
                completions=[
                    Completion(c.id, c.claim_token, Status.SENT, None, None, f"m-{c.id}", "log")
                    for c in claimed
                ]
            )
            assert recorded.accepted == {c.id for c in claimed}
        assert await statistics_count(db, database_url, QUEUE_SECONDARY_SCANS) == before
        assert await _unfinished_and_sent(db) == (0, CLAIMS * BATCH)


async def _after_an_analyze_of_no_windows(database_url: str) -> int:
    """Sequential scans of nq_rate_windows in a drain whose plans were made after an ANALYZE
    that found the table empty (as after a VACUUM (ANALYZE) of a new installation)."""
    async with Database(database_url, pool_size=1, name="notify-queue-worker") as db:
        await _backlog(db)
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await conn.execute("VACUUM (ANALYZE)")
        before = await statistics_count(db, database_url, WINDOW_TABLE_SCANS)
        await _drain_backlog(db)
        return await statistics_count(db, database_url, WINDOW_TABLE_SCANS) - before


async def test_the_admission_reads_windows_by_key_after_an_analyze_found_none(
    database_url: str,
) -> None:
    assert await _after_an_analyze_of_no_windows(database_url) == 0


async def test_without_the_drains_settings_the_windows_are_scanned_whole(
    database_url: str,
) -> None:
    # The claim's functions with their generic plans and without enable_seqscan off.
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        for name in CLAIM_FUNCTIONS:
            await conn.execute(f"ALTER FUNCTION {name} RESET enable_seqscan")
    assert await _after_an_analyze_of_no_windows(database_url) > 0
