"""4. Scale: does claiming stay flat as finished rows pile up, and what do rate limits cost?

Claims are driven in-process through DeliveryRepository (two claimers, each with its own
connection, batch 100, every claimed notification completed as SENT at once), so the figure is
the queue's own claim + complete cycle, with no provider or HTTP in it. History is added
cumulatively (INSERT ... SELECT generate_series of SENT rows over 30 days, then VACUUM ANALYZE
and a checkpoint, as a long-running table would look after autovacuum), and the same number of
due notifications is claimed at each size. EXPLAIN (ANALYZE, BUFFERS) of the claim's first step
is recorded too: its buffer count is the size-independent evidence.

Rate-limit cost: the same claim loop over notifications for one recipient each, for 10
recipients with a limit high enough to admit all (the cost of counting slots), and for 10
recipients at the default 10 per hour (almost every candidate deferred).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import psycopg

from benchmarks import queue
from benchmarks.context import Context
from benchmarks.env import LoadWatch
from benchmarks.progress import Progress, say
from notify_queue.models import Channel, Completion, Priority, Status
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery import DeliveryDefaults, DeliveryRepository
from notify_queue.repositories.queries import QUERIES

CLAIMERS = 2
BATCH = 100


def _defaults(rate_limit: int) -> DeliveryDefaults:
    return DeliveryDefaults(
        rate_limit=rate_limit,
        rate_window_seconds=3600.0,
        backoff_base_seconds=0.5,
        backoff_max_seconds=60.0,
        lease_seconds=300.0,
        webhook_url=None,
    )


async def claim_loop(
    url: str, expected: int, *, rate_limit: int = 10, label: str
) -> dict[str, Any]:
    """Claim until nothing is due; return throughput and claim-time percentiles."""
    timings: list[float] = []
    claimed = deferred = 0
    bar = Progress(label, expected)

    async def claimer() -> None:
        nonlocal claimed, deferred
        async with Database(url, pool_size=1, name="bench-claimer") as db:
            repo = DeliveryRepository(db, _defaults(rate_limit))
            while True:
                t0 = time.perf_counter()
                batch = await repo.notifications_claim(
                    priorities=list(Priority), channels=list(Channel), limit=BATCH
                )
                timings.append(time.perf_counter() - t0)
                if not batch.claimed and not batch.rate_limited:
                    return
                claimed += len(batch.claimed)
                deferred += len(batch.rate_limited)
                bar.update(claimed + deferred)
                if batch.claimed:
                    await repo.deliveries_complete(
                        completions=[
                            Completion(c.id, c.claim_token, Status.SENT, None, None, "sim")
                            for c in batch.claimed
                        ]
                    )

    t0 = time.perf_counter()
    await asyncio.gather(*(claimer() for _ in range(CLAIMERS)))
    elapsed = time.perf_counter() - t0
    bar.close()
    timings.sort()

    def pct(q: float) -> float:
        return round(timings[min(int(q * len(timings)), len(timings) - 1)] * 1000, 2)

    return {
        "claimed": claimed,
        "deferred": deferred,
        "seconds": round(elapsed, 3),
        "claimed_per_second": round(claimed / elapsed, 1),
        "candidates_per_second": round((claimed + deferred) / elapsed, 1),
        "claims": len(timings),
        "claim_p50_ms": pct(0.5),
        "claim_p99_ms": pct(0.99),
        "claim_max_ms": round(timings[-1] * 1000, 2),
    }


def explain_claim(url: str) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of the claim's first step (locks rolled back)."""
    sql = QUERIES["claim_lock_candidates"]
    params = {
        "priorities": [0, 1, 2],
        "channels": ["email", "sms", "push"],
        "limit": BATCH,
        "aging_seconds": 600.0,
    }
    with psycopg.connect(url) as conn:
        conn.execute(sql, params).fetchall()  # warm
        conn.rollback()
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params).fetchone()
        conn.rollback()
    assert plan is not None
    top = plan[0][0]
    node = top["Plan"]
    return {
        "claim_step1_ms": round(top["Execution Time"], 3),
        "claim_buffers_hit": node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0),
    }


def run(ctx: Context) -> None:
    s = ctx.sizes
    name = ctx.pg.database("scale")
    url = ctx.pg.url(name)
    try:
        queue.migrate(url)
        history = 0
        seeded = 0
        empty_rate: float | None = None
        for target in s.scale_history:
            if target > history:
                say(f"[scale] adding {target - history:,} finished rows (history {target:,})")
                bar = Progress("seeding history", target - history)
                queue.seed_finished(url, target - history, start=seeded, progress=bar.update)
                bar.close()
                seeded += target - history
                history = target
            prefix = f"s{uuid.uuid4().hex[:6]}-"
            queue.seed_due(url, s.scale_pending, prefix=prefix)
            plan = explain_claim(url)
            load = LoadWatch()
            figures = asyncio.run(
                claim_loop(url, s.scale_pending, label=f"claims at {history:,} finished rows")
            )
            with psycopg.connect(url, autocommit=True) as conn:
                size = conn.execute(
                    "SELECT pg_total_relation_size('nq_jobs')"
                    " + sum(pg_total_relation_size(inhrelid))"
                    " FROM pg_inherits WHERE inhparent = 'nq_delivery_log'::regclass"
                ).fetchone()
            figures |= plan | {"history_rows": history, "table_bytes": size[0] if size else None}
            if empty_rate is None:
                empty_rate = figures["claimed_per_second"]
            figures["claim_rate_ratio_vs_empty"] = round(
                figures["claimed_per_second"] / empty_rate, 3
            )
            if target == s.scale_history[-1] and target > 0:
                figures["claim_rate_ratio_largest_vs_empty"] = figures["claim_rate_ratio_vs_empty"]
            ctx.record(
                "scale",
                f"claim with {history:,} finished rows",
                figures,
                load=load,
                params={
                    "pending": s.scale_pending,
                    "claimers": CLAIMERS,
                    "batch": BATCH,
                    "history_rows": history,
                },
            )
            history += s.scale_pending  # they are finished rows now
    finally:
        ctx.pg.drop(name)

    n = s.rate_limit_notifications
    for label, recipients, limit in (
        ("one recipient each", None, 10),
        ("10 recipients, limit admits all", 10, 10_000_000),
        ("10 recipients, 10 per hour", 10, 10),
    ):
        name = ctx.pg.database("rl")
        url = ctx.pg.url(name)
        try:
            queue.migrate(url)
            queue.seed_due(url, n, recipients=recipients)
            load = LoadWatch()
            figures = asyncio.run(
                claim_loop(url, n, rate_limit=limit, label=f"rate limits: {label}")
            )
            ctx.record(
                "scale",
                f"rate limits: {label}",
                figures,
                load=load,
                params={"notifications": n, "recipients": recipients or n, "rate_limit": limit},
            )
        finally:
            ctx.pg.drop(name)
