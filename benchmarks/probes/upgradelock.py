"""How long creates stall while `migrate` builds the queue's indexes over a backlog: the index
builds with CONCURRENTLY (what `migrate` runs) against the plain CREATE INDEX they replaced
(docs/upgrading.md, "Index builds on the queue").

    python -m benchmarks.probes.upgradelock [--backlog 1000000] [--clients 3]
                                            [--modes concurrent,plain]

Per mode, a fresh database of a fresh embedded PostgreSQL, migrated, then made a database that
lacks the queue's three indexes (dropped, their step 0010 unrecorded: a database of
0.1.0 before the upgrade builds them); a backlog of pending notifications seeded with one
INSERT ... SELECT; then clients that create one notification after another through
`notify_queue_enqueue` (docs/enqueue.md), each connection with `lock_timeout = 2s`, while the
indexes are built: `concurrent`, `notify-queue migrate` as shipped; `plain`, the three builds as
the steps used to run them (plain CREATE INDEX, in one transaction), then `notify-queue migrate`,
which records the steps. Only the builds run, so the figures are theirs: how long they took, the
longest create meanwhile, and the creates refused (lock timeout). Writes
`benchmarks/results/upgradelock/<timestamp>.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from benchmarks import alternating
from benchmarks.env import fresh_postgres
from notify_queue.repositories.db import Database
from notify_queue.repositories.schema import migrate

RESULTS = Path(__file__).parent.parent / "results" / "upgradelock"
INDEXES = ("nq_jobs_waiting", "nq_jobs_digest", "nq_jobs_pending_created")
BUILD_STEPS = [10]
SEED = """
INSERT INTO nq_jobs (id, idempotency_key, request_hash, channel, recipient, subject, body,
                     priority, status, send_at, next_attempt_at, max_attempts, bucket)
SELECT gen_random_uuid(), 'backlog-' || g, 'seed', 'email', r, 'backlog',
       'queued before the upgrade', (g %% 3)::smallint, 'PENDING', now() + interval '1 day',
       now() + interval '1 day', 5, nq_bucket(r)
FROM generate_series(1, %s) AS g, LATERAL (SELECT 'r' || (g %% 5000) || '@example.com') AS x(r)
"""
# The builds as 0.2.0's steps ran them, in the migration's transaction.
PLAIN_BUILDS = """
CREATE INDEX IF NOT EXISTS nq_jobs_waiting ON nq_jobs (waiting_reason, waiting_until)
    WHERE status = 'PENDING' AND waiting_reason IS NOT NULL;
CREATE INDEX IF NOT EXISTS nq_jobs_digest ON nq_jobs (bucket, digest_id)
    WHERE digest_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS nq_jobs_pending_created ON nq_jobs (created_at, id)
    WHERE status = 'PENDING';
"""


class Creates:
    """Clients creating through the enqueue function, timing each call (a refused one too: it
    waited its lock timeout) and the gaps between successful creates."""

    def __init__(self, url: str, clients: int) -> None:
        self.url = url
        self.latencies: list[float] = []  # every call's, refused ones included
        self.refused: list[str] = []
        self.successes: list[float] = []  # when each successful create ended
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._client, args=(n,), daemon=True) for n in range(clients)
        ]

    def _client(self, number: int) -> None:
        request = json.dumps(
            {"channel": "email", "recipient": "u@example.com", "subject": "s", "body": "b"}
        )
        with psycopg.connect(self.url, autocommit=True, options="-c lock_timeout=2s") as conn:
            sequence = 0
            while not self._stop.is_set():
                sequence += 1
                began = time.monotonic()
                try:
                    conn.execute(
                        "SELECT notify_queue_enqueue(%s::jsonb, %s)",
                        (request, f"bench-{number}-{sequence}"),
                    )
                except (psycopg.errors.LockNotAvailable, psycopg.errors.TransactionRollback) as exc:
                    self.refused.append(str(exc).splitlines()[0])
                else:
                    self.successes.append(time.monotonic())
                self.latencies.append(time.monotonic() - began)
                time.sleep(0.02)

    def __enter__(self) -> Creates:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


async def _migrate(url: str) -> None:
    async with Database(url, pool_size=1) as db:
        await migrate(db)


def run_mode(url: str, mode: str, backlog: int, clients: int) -> dict[str, Any]:
    asyncio.run(_migrate(url))
    with psycopg.connect(url, autocommit=True) as conn:
        for index in INDEXES:
            conn.execute(f"DROP INDEX {index}")
        conn.execute("DELETE FROM nq_schema_steps WHERE version = ANY(%s)", (BUILD_STEPS,))
        began = time.monotonic()
        conn.execute(SEED, (backlog,))
        conn.execute("ANALYZE nq_jobs")
        seeded = time.monotonic() - began
    with Creates(url, clients) as creates:
        time.sleep(2)  # the clients' steady pace, before migrate
        before = len(creates.latencies)
        refused_before = len(creates.refused)
        began = time.monotonic()
        if mode == "plain":
            with psycopg.connect(url) as conn:  # one transaction, as the steps ran
                conn.execute(PLAIN_BUILDS)
        migrated = subprocess.run(
            [sys.executable, "-m", "notify_queue", "migrate", "--database-url", url],
            capture_output=True,
            text=True,
            check=False,
        )
        ended = time.monotonic()
        took = ended - began
        during = creates.latencies[before:]
        refused = creates.refused[refused_before:]
        ends = [began] + [t for t in creates.successes if began < t <= ended] + [ended]
    if migrated.returncode != 0:
        raise RuntimeError(f"migrate failed: {migrated.stderr[-4000:]}")
    result = {
        "mode": mode,
        "backlog": backlog,
        "seed_seconds": round(seeded, 1),
        "migrate_seconds": round(took, 2),
        "creates_during_migrate": len(during),
        "refused_during_migrate": len(refused),
        # The longest call, a refused one included (it waited its lock timeout), and the longest
        # time no create succeeded: how long creates stalled.
        "longest_create_seconds": round(max(during, default=0.0), 3),
        "longest_stall_seconds": round(max(b - a for a, b in itertools.pairwise(ends)), 3),
        "median_create_ms": round(statistics.median(during) * 1000, 2) if during else None,
        "refusals": sorted(set(refused))[:3],
    }
    print(json.dumps(result))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backlog", type=int, default=1_000_000)
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--modes", default="concurrent,plain")
    ap.add_argument("--output-dir", type=Path, default=RESULTS)
    args = ap.parse_args()
    runs = []
    with fresh_postgres("upgradelock") as pg:
        for mode in args.modes.split(","):
            url = pg.url(pg.database(f"upgradelock_{mode}"))
            runs.append(run_mode(url, mode, args.backlog, args.clients))
    alternating.write(args.output_dir, {"clients": args.clients, "runs": runs})


if __name__ == "__main__":
    main()
