"""The drain's statements are planned once per connection (docs/performance.md, "The drain's CPU,
step by step", step 7).

The claim's two statements and the completion are prepared at their first run on a connection and
run under `plan_cache_mode = force_generic_plan` in their own transaction (SET LOCAL): each call
after the first reuses the plan, where PostgreSQL's default makes five custom plans per
connection and statement, and a worker's pool handing out its connections in turn paid a plan on
nearly every call. Counted from the connection's own `pg_prepared_statements` (generic and custom
plans per prepared statement), never timed. Without prepared statements (a pooler that keeps
none) nothing is forced: an unprepared statement would build a generic plan on every call.
"""

from __future__ import annotations

from typing import Any

from notify_queue.models import Channel, Completion, Priority, Status
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery import DeliveryRepository
from tests.support import defaults, new, notification_service, status_counts

CLAIMS = 7
BATCH = 20
SENT_ATTEMPT = '[{"provider": "log", "outcome": "sent", "ms": 1}]'
# A distinctive piece of each statement's text, as pg_prepared_statements shows it.
STATEMENTS = {
    "claim_lock_candidates": "WITH candidates AS",
    "claim_admit_candidates": "WITH batch_all AS",
    "complete_deliveries": "WITH results AS",
}


async def _drain(db: Database) -> None:
    """CLAIMS claims of BATCH rows, each completed as SENT, on the pool's one connection."""
    await notification_service(db, announce=False).enqueue_many(
        [new() for _ in range(CLAIMS * BATCH)]
    )
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


async def _plans(db: Database) -> dict[str, tuple[int, int]]:
    """(generic plans, custom plans) of each drain statement prepared on the pool's connection."""
    async with db.connection() as conn:
        # The session's own view: what this connection prepared and how it planned each run.
        raw: Any = conn._conn
        cur = await raw.execute(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
        )
        rows = await cur.fetchall()
    found: dict[str, tuple[int, int]] = {}
    for name, marker in STATEMENTS.items():
        for row in rows:
            if marker in row["statement"]:
                found[name] = (int(row["generic_plans"]), int(row["custom_plans"]))
    return found


async def test_the_claim_and_the_completion_are_planned_once_per_connection(
    database_url: str,
) -> None:
    async with Database(database_url, pool_size=1, name="notify-queue-worker") as db:
        await _drain(db)
        plans = await _plans(db)
        assert plans == {name: (CLAIMS, 0) for name in STATEMENTS}, plans
        assert await _unfinished_and_sent(db) == (0, CLAIMS * BATCH)


async def test_without_prepared_statements_nothing_is_forced(database_url: str) -> None:
    async with Database(
        database_url, pool_size=1, name="notify-queue-worker", prepared_statements=False
    ) as db:
        await _drain(db)
        assert await _plans(db) == {}
        assert await _unfinished_and_sent(db) == (0, CLAIMS * BATCH)
