"""5. Priority under load: a LOW campaign (already due, 100,000 in full mode) drains while HIGH
one-time codes arrive at 50/s; how long do the HIGH ones take from due to SENT? Measured with
shared workers (every worker serves every lane) and with a dedicated HIGH worker
(`--priorities HIGH --webhook-dispatch off`, the chart's urgent pool) added beside them.

The dedicated worker leaves the relay to the shared ones: a relaying worker POSTs the campaign's
events on the event loop its HIGH deliveries need (measured: HIGH p50 60-70 ms relaying, about
30 ms not; p99 205-230 ms and 130-160 ms)."""

from __future__ import annotations

import asyncio
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
from benchmarks.scenarios.latency import percentiles
from notify_queue.models import Priority


async def _high_until_drained(url: str, rate: float, low: int) -> dict[str, Any]:
    drained = asyncio.Event()
    bar = Progress("LOW campaign draining", low)

    async def watch() -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("SET enable_seqscan = off")  # see queue.watcher
            while True:
                cur = await conn.execute(
                    "SELECT count(*) FROM nq_jobs WHERE priority = 2 AND status = 'PENDING'"
                )
                row = await cur.fetchone()
                left = int(row[0]) if row else 0
                bar.update(low - left)
                if left == 0:
                    drained.set()
                    return
                await asyncio.sleep(1.0)

    watcher = asyncio.create_task(watch())
    t0 = time.monotonic()
    async with SteadyEnqueuer(url) as high:
        await high.run(
            lambda i: new_notification("high", priority=Priority.HIGH), rate, until=drained
        )
    await watcher
    bar.close()
    return {"high_enqueued": high.sent, "drain_seconds": round(time.monotonic() - t0, 2)}


def _one(ctx: Context, *, dedicated: bool, webhooks: bool = True) -> None:
    s = ctx.sizes
    name = ctx.pg.database("prio")
    url = ctx.pg.url(name)
    shared = 2 if ctx.mode != "smoke" else 1
    label = (
        f"{shared} shared workers"
        + (" + 1 dedicated HIGH worker (not relaying)" if dedicated else "")
        + ("" if webhooks else ", no webhooks")
    )
    try:
        queue.migrate(url)
        # The LOW campaign becomes due only once every worker is up (so no figure includes a
        # worker's start-up): seeded a few seconds ahead, then the HIGH stream starts with it.
        queue.seed_due(url, s.priority_low, priority=2, prefix="low", due_in_seconds=600)
        say(f"[priority] {s.priority_low:,} LOW due, HIGH at {s.priority_high_rate:g}/s, {label}")
        procs = start_workers(ctx, url, shared, tag="shared", webhooks=webhooks)
        if dedicated:
            procs += start_workers(
                ctx,
                url,
                1,
                extra=["--priorities", "HIGH"],
                tag="high",
                webhooks=webhooks,
                relay=False,
            )
        try:
            wait_until_listening(url, len(procs))
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(
                    "UPDATE nq_jobs SET send_at = now(), next_attempt_at = now() WHERE priority = 2"
                )
                conn.execute("SELECT pg_notify('nq_wakeup', '')")
            load = LoadWatch()
            driven = asyncio.run(_high_until_drained(url, s.priority_high_rate, s.priority_low))
            with queue.watcher(url) as conn:
                deadline = time.monotonic() + 60
                while queue.any_unfinished(conn) and time.monotonic() < deadline:
                    time.sleep(0.2)
        finally:
            stop_all(procs)
        with psycopg.connect(url, autocommit=True) as conn:
            metrics = driven | percentiles(conn, "high", "high")
            row = conn.execute(
                "SELECT min(s.taken_at), max(n.sent_at), count(*) FROM nq_all_notifications n "
                "JOIN nq_rate_window_entries s ON s.notification_id = n.id"
                " WHERE n.priority = 2 AND n.status = 'SENT'"
            ).fetchone()
        if row and row[0] and row[1]:
            metrics["low_per_second"] = round(row[2] / (row[1] - row[0]).total_seconds(), 1)
        for q in ("p50", "p95", "p99", "max"):
            # The target's figure is the one with webhooks on; the runs without them keep theirs
            # under high_to_sent_* only.
            if webhooks and f"high_to_sent_{q}_ms" in metrics:
                metrics[f"high_due_to_sent_{q}_ms"] = metrics[f"high_to_sent_{q}_ms"]
        metrics["high_sent"] = metrics.get("high_count")
        ctx.record(
            "priority",
            label,
            metrics,
            load=load,
            params={
                "low": s.priority_low,
                "high_rate": s.priority_high_rate,
                "shared_workers": shared,
                "dedicated_high_workers": 1 if dedicated else 0,
                "webhooks": webhooks,
            },
        )
    finally:
        ctx.pg.drop(name)


def run(ctx: Context) -> None:
    _one(ctx, dedicated=False)
    _one(ctx, dedicated=True)
    # The same without webhook events: every worker process also relays the outbox, so a LOW
    # campaign's webhooks share even the dedicated HIGH worker's event loop; this isolates that.
    _one(ctx, dedicated=False, webhooks=False)
    _one(ctx, dedicated=True, webhooks=False)
