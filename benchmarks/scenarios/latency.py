"""3. Latency at a steady, moderate rate: due-now notifications enqueued one request at a time
(through the service, as the API does) while two workers run; due->claimed and due->SENT from
the database's timestamps. Scheduled notifications (due 1-3 s after they are enqueued) are sent
alongside, and their lateness measured: they must go out when due, not at the next poll."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import psycopg

from benchmarks import queue
from benchmarks.burn import start_workers, wait_until_listening
from benchmarks.context import Context
from benchmarks.enqueue import SteadyEnqueuer, new_notification
from benchmarks.env import LoadWatch
from benchmarks.procs import stop_all
from benchmarks.progress import Progress, say

# "Due" is the later of sendAt and the row's insertion (created_at, the INSERT transaction's
# now()): a due-now notification cannot be claimed before it exists, and how long the client took
# to get its INSERT in is the enqueuer's figure (insert_p99), not the queue's.
PERCENTILES = """
SELECT count(*),
       percentile_cont(ARRAY[0.5, 0.95, 0.99])
           WITHIN GROUP (ORDER BY extract(epoch FROM s.taken_at - d.due)),
       max(extract(epoch FROM s.taken_at - d.due)),
       percentile_cont(ARRAY[0.5, 0.95, 0.99])
           WITHIN GROUP (ORDER BY extract(epoch FROM n.sent_at - d.due)),
       max(extract(epoch FROM n.sent_at - d.due)),
       percentile_cont(0.99)
           WITHIN GROUP (ORDER BY greatest(extract(epoch FROM n.created_at - n.send_at), 0))
FROM nq_all_notifications n JOIN nq_rate_window_entries s ON s.notification_id = n.id,
     LATERAL (SELECT greatest(n.send_at, n.created_at) AS due) d
WHERE n.status = 'SENT' AND n.idempotency_key LIKE %s
"""


def percentiles(conn: psycopg.Connection[Any], prefix: str, label: str) -> dict[str, Any]:
    row = conn.execute(PERCENTILES, (prefix + "-%",)).fetchone()
    assert row is not None
    count, claimed, claimed_max, sent, sent_max, insert_p99 = row
    if not count:
        return {f"{label}_count": 0}

    def ms(seconds: Any) -> float:
        return round(float(seconds) * 1000, 1)

    return {
        f"{label}_count": count,
        f"{label}_to_claimed_p50_ms": ms(claimed[0]),
        f"{label}_to_claimed_p95_ms": ms(claimed[1]),
        f"{label}_to_claimed_p99_ms": ms(claimed[2]),
        f"{label}_to_claimed_max_ms": ms(claimed_max),
        f"{label}_to_sent_p50_ms": ms(sent[0]),
        f"{label}_to_sent_p95_ms": ms(sent[1]),
        f"{label}_to_sent_p99_ms": ms(sent[2]),
        f"{label}_to_sent_max_ms": ms(sent_max),
        # How long the INSERT took to start (request made -> the row's created_at).
        f"{label}_insert_p99_ms": ms(insert_p99),
    }


async def _drive(ctx: Context, url: str) -> dict[str, Any]:
    s = ctx.sizes
    rng = random.Random(7)
    async with SteadyEnqueuer(url) as due_now, SteadyEnqueuer(url) as scheduled:
        scheduled_rate = max(s.scheduled / s.latency_seconds, 1.0)
        bar = Progress(
            f"latency {s.latency_rate:g}/s for {s.latency_seconds:g}s",
            int(s.latency_rate * s.latency_seconds),
        )

        async def tick() -> None:
            while True:
                bar.update(due_now.sent)
                await asyncio.sleep(0.5)

        ticker = asyncio.create_task(tick())
        await asyncio.gather(
            due_now.run(
                lambda i: new_notification("due"), s.latency_rate, seconds=s.latency_seconds
            ),
            scheduled.run(
                lambda i: new_notification("sched", delay_seconds=rng.uniform(1.0, 3.0)),
                scheduled_rate,
                seconds=s.latency_seconds,
            ),
        )
        ticker.cancel()
        bar.close()
        return {
            "enqueued": due_now.sent,
            "scheduled_enqueued": scheduled.sent,
            "enqueue_late_starts": due_now.late_starts + scheduled.late_starts,
            "enqueue_failed": due_now.failed + scheduled.failed,
            "enqueue_achieved_per_second": due_now.achieved_per_second,
        }


def run(ctx: Context) -> None:
    name = ctx.pg.database("lat")
    url = ctx.pg.url(name)
    workers = 2 if ctx.mode != "smoke" else 1
    try:
        queue.migrate(url)
        procs = start_workers(ctx, url, workers)
        wait_until_listening(url, workers)
        load = LoadWatch()
        say(
            f"[latency] {ctx.sizes.latency_rate:g}/s due now + {ctx.sizes.scheduled} scheduled, "
            f"{workers} workers"
        )
        try:
            driven = asyncio.run(_drive(ctx, url))
            with queue.watcher(url) as conn:
                deadline = time.monotonic() + 60
                while queue.any_unfinished(conn) and time.monotonic() < deadline:
                    time.sleep(0.2)
        finally:
            stop_all(procs)
        with psycopg.connect(url, autocommit=True) as conn:
            metrics = driven | percentiles(conn, "due", "due") | percentiles(conn, "sched", "sched")
        # The scheduled ones' lateness: how long after their sendAt they were claimed / sent.
        for src, dst in (("sched_to_claimed", "late_claim"), ("sched_to_sent", "late")):
            for q in ("p50", "p99", "max"):
                if f"{src}_{q}_ms" in metrics:
                    metrics[f"{dst}_{q}_ms"] = metrics[f"{src}_{q}_ms"]
        ctx.record(
            "latency",
            f"steady {ctx.sizes.latency_rate:g}/s, W={workers}",
            metrics,
            load=load,
            params={
                "rate_per_second": ctx.sizes.latency_rate,
                "seconds": ctx.sizes.latency_seconds,
                "workers": workers,
                "scheduled": ctx.sizes.scheduled,
                "webhooks": True,
                "enqueue": "NotificationService.enqueue, one call per notification, "
                "debounced wake-up",
            },
        )
    finally:
        ctx.pg.drop(name)
