"""8. The webhook relay alone (issue 10): N pending events already in the outbox, one
`notify-queue relay` process, the counting receiver in a process of its own.

Nothing else runs: no worker, no API, so the figure is what one relay process moves. Events are
written straight into `nq_webhook_events` in the shape the completion statement writes them
(payload `{eventId, jobId, status, attemptCount, timestamp, provider}`), each for the receiver's
URL, the webhook URL of a policy that holds the signing secret: it goes through the outbound
guard as a namespace user's URL does (`--outbound-allow 127.0.0.0/8` opens loopback), and every
event is signed with its policy's secret, as in production. Events per second come from the
database's clock: the events recorded after the first recording statement, over the time from
that statement to the last one (each statement stamps its whole batch with one `delivered_at`,
so the first batch only starts the clock). The CPU split is read from `/proc` for the relay,
the receiver and PostgreSQL.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import psycopg

from benchmarks import queue
from benchmarks.burn import CpuSplit, top_statements
from benchmarks.context import Context
from benchmarks.env import LoadWatch
from benchmarks.procs import notify_queue
from benchmarks.progress import Progress, say

# A fixed, valid Standard Webhooks secret: signing costs the same as with a real one.
SECRET = "whsec_" + base64.b64encode(b"notify-queue relay benchmark key").decode()

_POLICY = "bench/relay"

_SEED_POLICY = """
INSERT INTO nq_policies (name, webhook_url, webhook_secrets)
VALUES (%(policy)s, %(url)s, ARRAY[%(secret)s])
ON CONFLICT (name) DO UPDATE SET webhook_url = excluded.webhook_url,
                                 webhook_secrets = excluded.webhook_secrets
"""

_SEED = """
INSERT INTO nq_webhook_events (id, notification_id, url, policy, payload)
SELECT e.id, e.job, %(url)s, %(policy)s,
       json_build_object(
           'eventId', e.id, 'jobId', e.job, 'status', 'SENT', 'attemptCount', 1,
           'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
           'provider', 'simulated')::text
FROM (SELECT gen_random_uuid() AS id, gen_random_uuid() AS job
      FROM generate_series(1, %(count)s)) e
"""

_PENDING = "SELECT count(*) FROM nq_webhook_events WHERE state = 'pending'"

_FIGURES = """
WITH d AS (SELECT delivered_at FROM nq_webhook_events WHERE state = 'delivered')
SELECT (SELECT count(*) FROM nq_webhook_events) AS events,
       (SELECT count(*) FROM d) AS delivered,
       (SELECT count(*) FROM nq_webhook_events WHERE state = 'failed') AS failed,
       (SELECT sum(attempts) FROM nq_webhook_events) AS posts,
       (SELECT min(delivered_at) FROM d) AS first_at,
       (SELECT max(delivered_at) FROM d) AS last_at,
       (SELECT count(*) FROM d WHERE delivered_at > (SELECT min(delivered_at) FROM d)) AS after,
       (SELECT count(DISTINCT delivered_at) FROM d) AS statements
"""


def seed_events(url: str, count: int, receiver_url: str, chunk: int = 50_000) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_SEED_POLICY, {"policy": _POLICY, "url": receiver_url, "secret": SECRET})
        for first in range(0, count, chunk):
            conn.execute(
                _SEED,
                {"url": receiver_url, "policy": _POLICY, "count": min(chunk, count - first)},
            )
        conn.execute("VACUUM (ANALYZE) nq_webhook_events")


def relay_figures(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    row = conn.execute(_FIGURES).fetchone()
    assert row is not None
    events, delivered, failed, posts, first_at, last_at, after, statements = row
    out: dict[str, Any] = {
        "events": events,
        "delivered": delivered,
        "failed": failed,
        "posts": int(posts or 0),
        "record_statements": statements,
    }
    if first_at is not None and last_at is not None and last_at > first_at:
        seconds = (last_at - first_at).total_seconds()
        out["seconds"] = round(seconds, 3)
        out["events_per_second"] = round(after / seconds, 1)
    return out


def run(ctx: Context) -> None:
    n = ctx.sizes.relay_events
    name = ctx.pg.database("nqrelay")
    url = ctx.pg.url(name)
    try:
        queue.migrate(url)
        say(f"[relay] {n:,} pending events, one relay process, signed, through the guard")
        seed_events(url, n, ctx.receiver.url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_statements_reset()")
        posts_before = ctx.receiver.counts()["posts"]
        load = LoadWatch()
        cpu = CpuSplit(ctx)
        args = [
            "--database-url",
            url,
            "--log-level",
            "WARNING",
            "--outbound-allow",
            "127.0.0.0/8",
        ]
        relay = notify_queue("relay", args, ctx.logdir, f"relay-{time.time_ns()}")
        bar = Progress("relay", n)
        deadline = time.monotonic() + max(120.0, n / 500)
        timed_out = False
        split: dict[str, Any] = {}
        try:
            with queue.watcher(url) as conn:
                last_count = time.monotonic()
                while queue.any_webhook_pending(conn):
                    if time.monotonic() - last_count > 3.0:
                        # A real count only now and then: it competes with the relay.
                        last_count = time.monotonic()
                        row = conn.execute(_PENDING).fetchone()
                        bar.update(n - (row[0] if row else 0))
                    if not relay.alive():
                        raise RuntimeError(f"the relay exited:\n{relay.log_tail()}")
                    if time.monotonic() > deadline:
                        timed_out = True
                        break
                    time.sleep(0.25)
            split = cpu.finish([relay], n, label="relay", unit="event")
        finally:
            bar.close()
            relay.stop()
        with psycopg.connect(url, autocommit=True) as conn:
            figures = relay_figures(conn) | split
            figures["top_statements"] = top_statements(conn)
        figures["receiver_posts"] = ctx.receiver.counts()["posts"] - posts_before
        figures["timed_out"] = timed_out
        ctx.record(
            "relay",
            "relay alone, signed, guarded URL",
            figures,
            load=load,
            params={"events": n, "signed": True, "guarded": True},
        )
    finally:
        ctx.pg.drop(name)
