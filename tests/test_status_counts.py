"""/status and /metrics counts: exact, and as cheap at 200,000 finished rows as at none.

Final states are counted by the status triggers (migration 0004) as rows enter and leave them;
PENDING and PROCESSING come from their partial indexes. The first test checks the counters
against a full count after every kind of state change; the second reads the plans' buffer counts
(EXPLAIN (ANALYZE, BUFFERS)) of the status queries before and after 20,000 and then 200,000
finished rows are added, so it measures work, not wall time: a scan grows tenfold between the
two, an index descent by a page at most.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg

from notify_queue.models import DeliveryResult, Outcome, Status
from notify_queue.repositories.db import Database
from notify_queue.repositories.notifications import NotificationRepository
from notify_queue.repositories.queries import QUERIES
from tests.support import delivery_service, new, notification_service


async def test_the_kept_counts_match_a_full_count_after_every_kind_of_change(
    db: Database, database_url: str
) -> None:
    service = notification_service(db, max_attempts=1)
    created = await service.enqueue_many(
        [new(recipient=f"u{i}@example.com") for i in range(12)]
        + [new(recipient="late@example.com", delay_seconds=3600)]
    )
    ids = [c.notification.id for c in created]
    delivery = delivery_service(db, rate_limit=100)
    batch = await delivery.claim(12)
    outcomes = (
        [Outcome.SENT] * 5 + [Outcome.PERMANENT_FAILURE] * 3 + [Outcome.TEMPORARY_FAILURE] * 2
    )
    results = [
        (claimed, DeliveryResult(outcome, error=None if outcome is Outcome.SENT else "x"))
        for claimed, outcome in zip(batch.claimed, outcomes, strict=False)
    ]
    await delivery.complete(results)  # 5 SENT, 3 FAILED, 2 DEAD_LETTERED (one attempt each)
    await service.cancel(ids[12])  # CANCELLED
    failed = next(
        c.id
        for c, o in zip(batch.claimed, outcomes, strict=False)
        if o is Outcome.PERMANENT_FAILURE
    )
    await service.retry(failed)  # FAILED -> PENDING leaves a final state

    status = await NotificationRepository(db).queue_status()
    with psycopg.connect(database_url) as conn:
        truth = dict(
            conn.execute(
                "SELECT status, count(*) FROM nq_all_notifications GROUP BY status"
            ).fetchall()
        )
    assert {s.value: n for s, n in status.counts.items() if n} == truth
    assert truth[Status.SENT] == 5 and truth[Status.FAILED] == 2 and truth[Status.CANCELLED] == 1


def _buffers(plan: dict[str, Any]) -> int:
    # A plan node's buffer counts include its children's.
    return int(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0))


# The negative control: what /status ran before the counters, a count over all history.
_COUNT_ALL_HISTORY = "SELECT status, count(*) FROM nq_all_notifications GROUP BY status"


def _scrape_buffers(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """Buffers each status query touches, from its actual plan (shared hits plus reads)."""
    measured = {}
    queries = {
        name: QUERIES[name]
        for name in ("queue_status_counts", "queue_status_due", "queue_status_webhooks")
    }
    for name, sql in (queries | {"count_all_history": _COUNT_ALL_HISTORY}).items():
        row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}").fetchone()
        assert row is not None
        document = row[0] if not isinstance(row[0], str) else json.loads(row[0])
        measured[name] = _buffers(document[0]["Plan"])
    return measured


def test_status_queries_touch_as_many_buffers_at_200k_finished_rows_as_at_none(
    database_url: str,
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        # A few unfinished rows and events, so both sides read the same non-empty indexes.
        conn.execute(
            """INSERT INTO nq_jobs (id, idempotency_key, request_hash, channel, recipient,
                   body, priority, status, send_at, next_attempt_at, max_attempts)
               SELECT gen_random_uuid(), 'pending-' || i, 'h', 'email', 'a@example.com', 'b',
                      1, 'PENDING', now(), now(), 6
               FROM generate_series(1, 10) i"""
        )
        conn.execute("ANALYZE")
        _scrape_buffers(conn)  # warm the catalog caches the first run pays for
        before = _scrape_buffers(conn)
        _add_history(conn, finished=20_000, first=0)
        middle = _scrape_buffers(conn)
        _add_history(conn, finished=180_000, first=20_000)
        after = _scrape_buffers(conn)
        counts = dict(
            conn.execute(
                "SELECT split_part(name, ':', 2), sum(n) FROM nq_counters GROUP BY name"
            ).fetchall()
        )
    assert counts["SENT"] == 180_000 and counts["FAILED"] == 20_000
    assert counts["delivered"] == 40_000
    # From none to some history the plans change once (a one-page table is read whole; with
    # history each count descends an index: a few pages). From 20k to 200k finished rows only an
    # index descent may gain a level or a visibility-map page: a handful of buffers, while the
    # count over all history grows tenfold.
    control = after.pop("count_all_history")
    assert control > 5 * middle["count_all_history"], (middle, control)  # grows with history
    for name, buffers in after.items():
        assert buffers <= middle[name] + 4, (name, before, middle, after)
        assert buffers <= before[name] + 8, (name, before, middle, after)


def _add_history(conn: psycopg.Connection[Any], *, finished: int, first: int) -> None:
    """`finished` notifications already SENT or FAILED and a delivered event for a fifth,
    counted as the statements that write them count them (nq_count, 0012)."""
    conn.execute(
        """WITH logged AS (
               INSERT INTO nq_delivery_log (id, idempotency_key, request_hash, channel,
                   recipient, body, priority, status, send_at, next_attempt_at, max_attempts,
                   finished_at)
               SELECT gen_random_uuid(), 'done-' || i, 'h', 'email', 'a@example.com', 'b', 1,
                      CASE WHEN i %% 10 = 0 THEN 'FAILED' ELSE 'SENT' END, now(), now(), 6, now()
               FROM generate_series(%(first)s + 1, %(first)s + %(n)s) i
               RETURNING status)
           SELECT nq_count('notifications', NULL, array_agg(status), '{}') FROM logged""",
        {"first": first, "n": finished},
    )
    conn.execute(
        """WITH events AS (
               INSERT INTO nq_webhook_events (id, notification_id, url, payload, state)
               SELECT gen_random_uuid(), gen_random_uuid(), 'https://example.com/h', '{}',
                      'delivered'
               FROM generate_series(1, %(n)s)
               RETURNING state)
           SELECT nq_count('webhooks', NULL, array_agg(state), '{}') FROM events""",
        {"n": finished // 5},
    )
    conn.execute("VACUUM ANALYZE")
