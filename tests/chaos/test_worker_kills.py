"""Workers killed with SIGKILL again and again during a run of thousands of notifications.

Three worker processes deliver through the HTTP provider, which fails 20% of calls with 503;
every fraction of a second one of them is killed with `kill -9` (no chance to hand anything back)
and a fresh one started. The lease is 2 s. Afterwards every notification must be final, the
provider must have delivered each key exactly once (repeats after a crash are absorbed by the
idempotency key and counted), nothing may have sat in PROCESSING long after its lease, and every
outcome's webhook must have arrived, signed, with its original eventId.
"""

from __future__ import annotations

import asyncio
import os
import random
import time

from notify_queue.repositories.db import Database
from tests.chaos.harness import (
    all_final,
    audit,
    counts,
    enqueue,
    lost_outcomes_bound,
    new_notifications,
    poll,
    read_rows,
    record,
    worker_flags,
)
from tests.chaos.peers import ChaosProvider, SignedWebhookReceiver

NOTIFICATIONS = int(os.environ.get("NOTIFY_QUEUE_CHAOS_NOTIFICATIONS", "2400"))
WORKERS = 3
# Enough kills to land in every phase; bounded so a slow machine does not make the run longer.
MAX_KILLS = 30
LEASE_SECONDS = 2.0
# Housekeeping runs every poll interval (0.2 s) in every running worker, so "stuck" means still
# PROCESSING this long after the lease ran out while some worker had been up all that time. Only
# then: on a busy machine a fresh worker takes seconds to start, and with one killed every half
# second there can be stretches with no worker up at all (seen: 32 overdue, under two suites).
STUCK_AFTER_SECONDS = 3.0


async def _overdue_leases(db: Database) -> int:
    rows = await read_rows(
        db,
        "SELECT count(*) AS n FROM nq_all_notifications WHERE status = 'PROCESSING'"
        " AND lease_expires_at < now() - make_interval(secs => %(slack)s)",
        {"slack": STUCK_AFTER_SECONDS},
    )
    return int(rows[0]["n"])


async def _webhooks_settled(db: Database) -> bool:
    rows = await read_rows(
        db, "SELECT count(*) AS n FROM nq_webhook_events WHERE state <> 'delivered'"
    )
    return rows[0]["n"] == 0


async def test_every_notification_ends_final_and_delivered_once_while_workers_are_killed(
    db: Database, database_url: str, provider: ChaosProvider, receiver: SignedWebhookReceiver, spawn
) -> None:
    provider.failure_rate = 0.2
    provider.latency_seconds = 0.005
    rng = random.Random(86)
    workers = spawn(
        database_url,
        *worker_flags(
            provider,
            receiver,
            lease_seconds=LEASE_SECONDS,
            batch_size=50,
            concurrency=32,
        ),
    )
    for _ in range(WORKERS):
        workers.start()
    ids = await enqueue(db, new_notifications(NOTIFICATIONS, tag="kill9"))

    started = time.monotonic()
    worst_overdue = 0
    up_since: dict[int, float] = {}  # pid -> when this loop first saw its "worker started"
    # Kill until most of the run is done, so kills land while claims, deliveries, completions
    # and webhook posts are all in flight.
    while not await all_final(db, NOTIFICATIONS) and time.monotonic() - started < 90:
        final = NOTIFICATIONS - sum(
            n for s, n in (await counts(db)).items() if s in ("PENDING", "PROCESSING")
        )
        if final < NOTIFICATIONS * 0.9 and workers.killed < MAX_KILLS:
            victim = rng.choice(workers.alive)
            await asyncio.to_thread(workers.kill9, victim)
            workers.start()
        for proc in workers.alive:
            if proc.pid not in up_since and "worker started" in workers.log(proc):
                up_since[proc.pid] = time.monotonic()
        longest_up = max(
            (time.monotonic() - up_since.get(p.pid, time.monotonic())) for p in workers.alive
        )
        if longest_up >= STUCK_AFTER_SECONDS:
            worst_overdue = max(worst_overdue, await _overdue_leases(db))
        await asyncio.sleep(rng.uniform(0.3, 0.8))
    await poll(lambda: all_final(db, NOTIFICATIONS), timeout=60, what="every notification final")
    await poll(lambda: _webhooks_settled(db), timeout=60, what="every webhook delivered")
    elapsed = time.monotonic() - started

    survivors = workers.alive
    assert len(survivors) == WORKERS, "a worker died by itself"
    await workers.ready(*survivors)
    for proc in survivors:
        workers.terminate(proc)
    codes = [await asyncio.to_thread(p.wait, 20) for p in survivors]

    # Each kill may repeat what the victim had claimed and not recorded; nothing else may.
    explained = lost_outcomes_bound(workers_lost=workers.killed, concurrency=32, batch_size=50)
    result = await audit(db, ids, provider, receiver, repeats_explained=explained)
    result.extra |= {
        "kills": workers.killed,
        "seconds": round(elapsed, 1),
        "worst_overdue_leases": worst_overdue,
    }
    record("kill -9 workers", result)
    assert result.problems == []
    assert workers.killed >= 5, "the run ended before enough kills"
    assert worst_overdue == 0, "a notification stayed PROCESSING long after its lease"
    assert (
        result.deliveries
        == result.statuses.get("SENT", 0)
        + result.extra["delivered_but_dead_lettered_after_recheck"]
    )
    assert codes == [0] * WORKERS
