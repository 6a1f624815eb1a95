"""Graceful shutdown (SIGTERM) of every worker under load.

Two workers deliver a stream of notifications; a few keys stall at the provider for far longer
than the shutdown grace, so when SIGTERM arrives the workers hold deliveries that cannot finish.
Checked: both exit 0 within the grace period plus a little; nothing is left PROCESSING or leased;
what finished in time was recorded; what was claimed but not sent went back to PENDING without
using an attempt (its first real attempt later is attempt 1), and a fresh worker then delivers
everything exactly once.
"""

from __future__ import annotations

import asyncio
import random
import re

from notify_queue.repositories.db import Database
from tests.chaos.harness import (
    all_final,
    audit,
    enqueue,
    new_notifications,
    poll,
    read_rows,
    record,
    worker_flags,
)
from tests.chaos.peers import ChaosProvider, Stall

NOTIFICATIONS = 1200
STALLED = 40
GRACE_SECONDS = 1.0


async def test_sigterm_under_load_hands_unsent_work_back_free_and_leaves_nothing_leased(
    db: Database, database_url: str, provider: ChaosProvider, spawn
) -> None:
    provider.latency_seconds = 0.005
    batch = new_notifications(NOTIFICATIONS, tag="sigterm")
    stalled = {str(n.id) for n in random.Random(15).sample(batch, STALLED)}
    for key in stalled:
        provider.stalls[key] = Stall(seconds=120, status=503)
    procs = spawn(
        database_url,
        *worker_flags(
            provider, None, lease_seconds=60, concurrency=16, shutdown_grace_seconds=GRACE_SECONDS
        ),
    )
    workers = [procs.start(), procs.start()]
    await procs.ready(*workers)
    ids = await enqueue(db, batch)

    # Under load: deliveries are flowing and stalled calls hold slots in both workers.
    await poll(lambda: _under_load(db, provider), timeout=30, what="load with stalled deliveries")
    for proc in workers:
        procs.terminate(proc)
    codes = [await asyncio.to_thread(p.wait, GRACE_SECONDS + 15) for p in workers]
    assert codes == [0, 0]

    rows = await read_rows(
        db,
        "SELECT id, status, attempt_count, claim_token, lease_expires_at FROM nq_all_notifications",
    )
    leased = [
        r for r in rows if r["status"] == "PROCESSING" or r["claim_token"] or r["lease_expires_at"]
    ]
    handed_back = [r for r in rows if r["status"] == "PENDING" and provider.calls[str(r["id"])] > 0]
    sent = [r for r in rows if r["status"] == "SENT"]
    logged = sum(int(n) for n in re.findall(r"handed back (\d+) unfinished", procs.all_logs()))
    assert leased == []
    assert all(r["attempt_count"] == 1 for r in sent)
    assert all(r["status"] in ("PENDING", "SENT") for r in rows)
    assert all(r["attempt_count"] == 0 for r in rows if r["status"] == "PENDING")
    assert handed_back and {str(r["id"]) for r in handed_back} <= stalled
    assert logged == len(handed_back)

    provider.release_stalls()
    for key in stalled:
        provider.stalls.pop(key)
    procs.start()
    await poll(lambda: all_final(db, NOTIFICATIONS), timeout=60, what="drained by a fresh worker")
    again = await read_rows(
        db,
        "SELECT attempt_count FROM nq_all_notifications WHERE id = ANY(%(ids)s::uuid[])",
        {"ids": [r["id"] for r in handed_back]},
    )
    result = await audit(db, ids, provider)
    result.extra |= {
        "sent_before_sigterm": len(sent),
        "handed_back": len(handed_back),
        "exit_codes": codes,
    }
    record("graceful shutdown under load", result)
    assert result.problems == []
    assert all(r["attempt_count"] == 1 for r in again), "a handed-back claim used up an attempt"


async def _under_load(db: Database, provider: ChaosProvider) -> bool:
    rows = await read_rows(
        db, "SELECT count(*) AS n FROM nq_all_notifications WHERE status = 'SENT'"
    )
    return rows[0]["n"] >= 300 and provider.stalled_now >= 20
