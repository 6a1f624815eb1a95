"""Fair share (docs/quotas.md, "Fair share"): how long a tenant's notification waits behind
another tenant's backlog, in claim rounds, and what the claim costs PostgreSQL per notification.

    python -m benchmarks.fairshare [--a-notifications N] [--b-notifications M]
                                   [--batch-size B] [--rounds R] [--src SRC,...]

A fresh embedded PostgreSQL; per run a fresh database migrated by that checkout's code. Tenant A
has N notifications due an hour ago (`make bench-fairshare-1m`: N = 1,000,000); tenant B's M
notifications become due one per claim round, each just before the round's claim. The claims are
the worker's own (`DeliveryRepository.notifications_claim`, batch B, every lane and channel),
run in a child process with that checkout's code; claimed rows are left PROCESSING (the
completion is not what is measured). A B notification's delay is the number of claim rounds
between the one it became due in and the one that claimed it (0: the same round); one never
claimed within M rounds counts as M. PostgreSQL's CPU (every backend) over the rounds, divided by
the notifications claimed, is the claim's cost per notification.

`--src` alternates checkouts within each round (`.` is this one): beside a checkout from before
fair share, where B's rows wait behind A's backlog, the same host gives both figures. A checkout
without the `tenant` column gets the same rows without it. Writes
`benchmarks/results/fairshare/<timestamp>.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

from benchmarks import alternating, queue
from benchmarks.dbcost import postgres_cpu_seconds
from benchmarks.env import BenchPostgres, fresh_postgres

RESULTS = Path(__file__).parent / "results" / "fairshare"

_SEED = """
INSERT INTO nq_jobs (
    id, idempotency_key, request_hash, channel, recipient, subject, body, priority, status,
    send_at, next_attempt_at, max_attempts, created_at, updated_at, bucket{tenant_column})
SELECT gen_random_uuid(), %(prefix)s || g, 'bench', 'email', r.recipient, 'Your receipt',
       repeat('x', 120), 1, 'PENDING', now() + %(due)s::interval, now() + %(due)s::interval, 6,
       now() - interval '1 hour' + g * interval '1 microsecond', now(),
       nq_bucket(r.recipient){tenant_value}
FROM generate_series(%(first)s::bigint, %(last)s::bigint) g,
     LATERAL (SELECT 'user-' || %(prefix)s || g || '@example.com' AS recipient) r
"""


def seed(url: str, prefix: str, count: int, due: str, tenant: str) -> None:
    """`count` NORMAL notifications of `tenant` (where the schema has tenants), each its own
    recipient, due at now() + `due`."""
    with psycopg.connect(url, autocommit=True) as conn:
        tenants = conn.execute(
            "SELECT 1 FROM information_schema.columns"
            " WHERE table_name = 'nq_jobs' AND column_name = 'tenant'"
        ).fetchone()
        sql = _SEED.format(
            tenant_column=", tenant" if tenants else "",
            tenant_value=", %(tenant)s" if tenants else "",
        )
        for first in range(1, count + 1, 100_000):
            last = min(first + 99_999, count)
            conn.execute(
                sql,
                {"prefix": prefix, "due": due, "first": first, "last": last, "tenant": tenant},
            )
        conn.execute("VACUUM (ANALYZE) nq_jobs")


async def claim_rounds(url: str, batch_size: int) -> dict[str, Any]:
    """The child: one claim round per B notification; that notification made due just before."""
    from notify_queue.models import Channel, Priority
    from notify_queue.repositories.db import Database
    from notify_queue.repositories.delivery import DeliveryDefaults, DeliveryRepository

    async with Database(url, pool_size=2) as db:
        defaults = DeliveryDefaults(
            rate_limit=10,
            rate_window_seconds=3600.0,
            backoff_base_seconds=0.5,
            backoff_max_seconds=60.0,
            lease_seconds=3600.0,
            webhook_url=None,
        )
        repository = DeliveryRepository(db, defaults)
        side = await psycopg.AsyncConnection.connect(url, autocommit=True)
        cursor = await side.execute(
            "SELECT id FROM nq_jobs WHERE idempotency_key LIKE 'b%' ORDER BY created_at"
        )
        b_ids = [r[0] for r in await cursor.fetchall()]
        due_round: dict[Any, int] = {}
        delays: list[int] = []
        claimed = 0
        for round_, b_id in enumerate(b_ids):
            await side.execute("UPDATE nq_jobs SET next_attempt_at = now() WHERE id = %s", (b_id,))
            due_round[b_id] = round_
            batch = await repository.notifications_claim(
                priorities=list(Priority), channels=list(Channel), limit=batch_size
            )
            claimed += len(batch.claimed)
            for c in batch.claimed:
                if c.id in due_round:
                    delays.append(round_ - due_round.pop(c.id))
        delays += [len(b_ids)] * len(due_round)
        await side.close()
    return {"claimed": claimed, "delays": delays}


def one_run(
    pg: BenchPostgres, src: str, a_count: int, b_count: int, batch_size: int
) -> dict[str, Any]:
    name = pg.database("fairshare")
    url = pg.url(name)
    env = alternating.checkout_environment(src)
    queue.migrate(url, env)
    seed(url, "a", a_count, "-1 hour", "team-a")
    seed(url, "b", b_count, "1 day", "team-b")
    assert pg.server.pid is not None
    before = postgres_cpu_seconds(pg.server.pid)
    child = subprocess.run(
        [sys.executable, "-m", "benchmarks.fairshare", "--child", url, str(batch_size)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    cpu = postgres_cpu_seconds(pg.server.pid) - before
    result = json.loads(child.stdout)
    delays = sorted(result["delays"])
    pg.drop(name)
    return {
        "b_p99_delay_rounds": delays[min(len(delays) - 1, int(len(delays) * 0.99))],
        "b_max_delay_rounds": delays[-1],
        "claimed": result["claimed"],
        "postgres_cpu_us_per_claimed": round(cpu / max(result["claimed"], 1) * 1e6, 1),
    }


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(asyncio.run(claim_rounds(sys.argv[2], int(sys.argv[3])))))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a-notifications", type=int, default=100_000)
    ap.add_argument("--b-notifications", type=int, default=1_000)
    ap.add_argument("--batch-size", type=int, default=100)
    alternating.add_arguments(ap, RESULTS)
    args = ap.parse_args()
    sources = args.src.split(",")
    with fresh_postgres("fairshare") as pg:
        runs = alternating.alternate(
            args.rounds,
            sources,
            lambda src: one_run(
                pg, src, args.a_notifications, args.b_notifications, args.batch_size
            ),
            lambda run: (
                f"B's delay p99 {run['b_p99_delay_rounds']} rounds"
                f" (max {run['b_max_delay_rounds']}), PostgreSQL"
                f" {run['postgres_cpu_us_per_claimed']} us per claimed notification"
            ),
        )
    figures = ("b_p99_delay_rounds", "b_max_delay_rounds", "postgres_cpu_us_per_claimed")
    medians = alternating.medians(runs, sources, figures)
    alternating.write(
        args.output_dir,
        {
            "a_notifications": args.a_notifications,
            "b_notifications": args.b_notifications,
            "batch_size": args.batch_size,
            "runs": runs,
            "medians": medians,
        },
    )


if __name__ == "__main__":
    main()
