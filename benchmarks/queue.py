"""Notify Queue's tables as the benchmarks see them: bulk seeding and reading the results.

Seeding writes rows straight into nq_jobs (due work) and nq_delivery_log (history) with
INSERT ... SELECT generate_series, in chunks, because what is measured afterwards is the workers,
not the enqueue path (ingest has its own scenario, which writes the idempotency keys too).
Every figure is computed from the database's timestamps:

- a claim's moment is its rate-limit slot's `taken_at` (the claim transaction's now(); the slot
  is kept when the attempt was SENT), so "first claim" is min(taken_at);
- a delivery's moment is `sent_at` (the completion statement's now());
- a webhook's moment is the event's `delivered_at`.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import psycopg
from tests.support import delivery_log_history

FINISHED = ("SENT", "FAILED", "DEAD_LETTERED", "CANCELLED", "EXPIRED")


def migrate(url: str, env: dict[str, str] | None = None) -> None:
    """`notify-queue migrate`, with `env` (alternating.checkout_environment) that checkout's."""
    subprocess.run(
        [sys.executable, "-m", "notify_queue", "migrate", "--database-url", url],
        check=True,
        capture_output=True,
        env=env,
    )


_SEED = """
INSERT INTO nq_jobs (
    id, idempotency_key, request_hash, channel, recipient, subject, body, priority, status,
    send_at, next_attempt_at, max_attempts, created_at, updated_at, bucket)
SELECT gen_random_uuid(), %(prefix)s || g, 'bench', 'email', r.recipient,
       'Your receipt', repeat('x', %(body_bytes)s), %(priority)s, 'PENDING',
       now() + make_interval(secs => %(due_in)s), now() + make_interval(secs => %(due_in)s), 6,
       now() - make_interval(secs => (%(last)s - g) * 0.000001), now(), nq_bucket(r.recipient)
FROM generate_series(%(first)s::bigint, %(last)s::bigint) g,
     LATERAL (SELECT CASE WHEN %(recipients)s::int IS NULL
                          THEN 'user-' || %(prefix)s || g || '@example.com'
                          ELSE 'user-' || (g %% %(recipients)s::int) || '@example.com' END
                  AS recipient) r
"""

_SEED_FINISHED = """
INSERT INTO nq_delivery_log (
    id, idempotency_key, request_hash, channel, recipient, subject, body, priority, status,
    send_at, next_attempt_at, max_attempts, attempt_count, sent_at, provider_message_id,
    created_at, updated_at, finished_at)
SELECT gen_random_uuid(), 'old-' || g, 'bench', 'email',
       'user-' || (g %% 1000000) || '@example.com', 'Your receipt', repeat('x', 120),
       (g %% 3)::smallint, 'SENT', t, t, 6, 1, t + interval '1 second',
       'sim-' || g, t, t + interval '1 second', t + interval '1 second'
FROM generate_series(%(first)s::bigint, %(last)s::bigint) g,
     LATERAL (SELECT now() - interval '30 days' + g * interval '200 milliseconds' AS t) ts
"""


def seed_due(
    url: str,
    count: int,
    *,
    prefix: str = "n",
    priority: int = 1,
    recipients: int | None = None,
    due_in_seconds: float = -1.0,
    body_bytes: int = 120,
    chunk: int = 50_000,
    progress: Callable[[int], None] | None = None,
) -> None:
    """`count` PENDING notifications due `due_in_seconds` from now (negative: already due), each
    for its own recipient unless `recipients` spreads them over that many."""
    with psycopg.connect(url, autocommit=True) as conn:
        for first in range(1, count + 1, chunk):
            last = min(first + chunk - 1, count)
            conn.execute(
                _SEED,
                {
                    "prefix": prefix,
                    "recipients": recipients,
                    "body_bytes": body_bytes,
                    "priority": priority,
                    "due_in": due_in_seconds,
                    "first": first,
                    "last": last,
                },
            )
            if progress:
                progress(last)
        conn.execute("VACUUM (ANALYZE) nq_jobs")


def seed_finished(
    url: str,
    count: int,
    *,
    start: int = 0,
    chunk: int = 250_000,
    progress: Callable[[int], None] | None = None,
) -> None:
    """`count` SENT rows of the last 30 days (numbered from `start`, so history can be added to):
    the history a long-running queue accumulates, in the day partitions such a queue has (a new
    database has them from today on)."""
    with psycopg.connect(url, autocommit=True) as conn:
        delivery_log_history(conn)
        for first in range(start + 1, start + count + 1, chunk):
            last = min(first + chunk - 1, start + count)
            conn.execute(_SEED_FINISHED, {"first": first, "last": last})
            if progress:
                progress(last - start)
        conn.execute("VACUUM (ANALYZE) nq_delivery_log")
        conn.execute("CHECKPOINT")


def watcher(url: str) -> psycopg.Connection[Any]:
    """The connection that watches a run. Sequential scans are off for it: the statistics say
    every row is PENDING (they were gathered right after seeding), so the planner would answer
    "is anything left?" by scanning the table from the start, through every row already SENT,
    tens of milliseconds that would be taken from the system being measured."""
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("SET enable_seqscan = off")
    return conn


def any_unfinished(conn: psycopg.Connection[Any]) -> bool:
    """Cheap (the top of two partial indexes): can be asked often without disturbing the run."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM nq_jobs WHERE status = 'PENDING'"
        "               ORDER BY priority, next_attempt_at, created_at LIMIT 1)"
        " OR EXISTS (SELECT 1 FROM nq_jobs WHERE status = 'PROCESSING'"
        "            ORDER BY lease_expires_at LIMIT 1)"
    ).fetchone()
    return bool(row and row[0])


def any_webhook_pending(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM nq_webhook_events WHERE state = 'pending'"
        " ORDER BY next_attempt_at LIMIT 1)"
    ).fetchone()
    return bool(row and row[0])


def unfinished(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM nq_jobs WHERE status IN ('PENDING', 'PROCESSING')"
    ).fetchone()
    return int(row[0]) if row else 0


def burn_down_figures(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """Totals and timings of a burn-down, from the database's clock."""
    n = conn.execute(
        """SELECT count(*) FILTER (WHERE status = 'SENT') AS sent,
                  count(*) FILTER (WHERE status IN ('FAILED', 'DEAD_LETTERED')) AS failed,
                  count(*) AS total, sum(attempt_count) AS attempts,
                  max(sent_at) AS last_sent, min(sent_at) AS first_sent
           FROM nq_all_notifications"""
    ).fetchone()
    first_claim = conn.execute("SELECT min(taken_at) FROM nq_rate_window_entries").fetchone()
    hooks = conn.execute(
        """SELECT count(*) FILTER (WHERE state = 'delivered'), count(*),
                  min(delivered_at), max(delivered_at), sum(attempts)
           FROM nq_webhook_events"""
    ).fetchone()
    assert n is not None and first_claim is not None and hooks is not None
    sent, failed, total, attempts, last_sent, _first_sent = n
    start = first_claim[0]
    out: dict[str, Any] = {
        "total": total,
        "sent": sent,
        "failed_or_dead": failed,
        "attempts": int(attempts or 0),
    }
    if start is not None and last_sent is not None:
        seconds = (last_sent - start).total_seconds()
        out["seconds"] = round(seconds, 3)
        out["notifications_per_second"] = round(sent / seconds, 1) if seconds > 0 else None
    delivered, events, _first_hook, last_hook, hook_attempts = hooks
    out["webhook_events"] = events
    out["webhooks_delivered"] = delivered
    out["webhook_posts"] = int(hook_attempts or 0)
    if delivered and start is not None and last_hook is not None:
        seconds = (last_hook - start).total_seconds()
        out["webhook_seconds"] = round(seconds, 3)
        out["webhooks_per_second"] = round(delivered / seconds, 1) if seconds > 0 else None
    return out
