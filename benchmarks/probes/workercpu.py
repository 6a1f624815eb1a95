"""The workers' own CPU per notification in a burst (issue 20: what the drain costs besides
PostgreSQL; docs/performance.md, "The workers' share of the drain").

    python -m benchmarks.probes.workercpu [--notifications N] [--workers W] [--rounds R]
                                          [--src SRC,...] [--batch-sizes B,...]

A fresh embedded PostgreSQL, and per run a fresh database: `notify-queue migrate`, W real
`notify-queue worker` processes (default flags, no webhook target), started and listening before
anything is due, so their start-up (imports, pools) is not counted. Then N notifications, each
its own recipient, are seeded due a few seconds later and the workers are woken; their CPU (user +
system, from /proc) and PostgreSQL's (every backend, reaped ones too) are read just before the
notifications fall due and again once none is unfinished. Throughput is from the database's clock
(the first claim to the last `sent_at`).

`--src` runs each listed checkout's code in turn (`<checkout>/src` as the workers'
PYTHONPATH; `.` is this one), alternating within each round, so two versions meet the same host.
`--batch-sizes` alternates claim sizes the same way (`--batch-size` of every worker; each checkout
at each size): what the claim's cost per statement weighs against its cost per row.
The host moves the workers' and PostgreSQL's CPU together between rounds (±10% here), so each run
also reports their ratio, the steadier figure for two versions of the worker. Prints one line per
run and the medians; writes `benchmarks/results/workercpu/<timestamp>.json`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from benchmarks import alternating, queue
from benchmarks.burn import cpu_seconds, wait_until_listening
from benchmarks.dbcost import postgres_cpu_seconds
from benchmarks.env import BenchPostgres, fresh_postgres

RESULTS = Path(__file__).parent.parent / "results" / "workercpu"
DUE_IN_SECONDS = 6.0


def one_run(
    pg: BenchPostgres, src: str, notifications: int, workers: int, batch_size: int | None = None
) -> dict[str, Any]:
    name = pg.database("workercpu")
    url = pg.url(name)
    env = alternating.checkout_environment(src)
    # Each checkout's own schema functions: the database's cost is what is compared.
    queue.migrate(url, env)
    command = [sys.executable, "-m", "notify_queue", "worker", "--database-url", url]
    if batch_size is not None:
        command += ["--batch-size", str(batch_size)]
    procs = [
        subprocess.Popen(
            [*command, "--log-level", "WARNING"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(workers)
    ]
    try:
        wait_until_listening(url, workers)
        watched = [p.pid for p in procs]
        due = time.monotonic() + DUE_IN_SECONDS
        queue.seed_due(url, notifications, due_in_seconds=DUE_IN_SECONDS)
        with psycopg.connect(url, autocommit=True) as conn:
            # The seed is SQL, which wakes nobody: the workers look now and wait for the due time.
            conn.execute("SELECT pg_notify('nq_wakeup', '')")
            time.sleep(max(due - time.monotonic() - 0.5, 0.0))
            assert pg.server.pid is not None
            workers0, postgres0 = cpu_seconds(watched), postgres_cpu_seconds(pg.server.pid)
            while queue.any_unfinished(conn):
                time.sleep(0.05)
            workers1, postgres1 = cpu_seconds(watched), postgres_cpu_seconds(pg.server.pid)
            figures = queue.burn_down_figures(conn)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        pg.drop(name)
    worker_cpu, postgres_cpu = workers1 - workers0, postgres1 - postgres0
    return {
        "batch_size": batch_size,
        "worker_cpu_us": round(worker_cpu / notifications * 1e6, 1),
        "postgres_cpu_us": round(postgres_cpu / notifications * 1e6, 1),
        # The host moves both by ±10% between rounds, together: their ratio within a round is
        # the steadier figure for comparing two versions of the worker.
        "worker_over_postgres": round(worker_cpu / postgres_cpu, 3),
        "notifications_per_second": figures.get("notifications_per_second"),
        "sent": figures["sent"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--notifications", type=int, default=30_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--batch-sizes", help="claim sizes to alternate, comma-separated (default: the default)"
    )
    alternating.add_arguments(ap, RESULTS)
    args = ap.parse_args()
    sizes: list[int | None] = (
        [int(b) for b in args.batch_sizes.split(",")] if args.batch_sizes else [None]
    )
    # A variant is a checkout, or a checkout at a claim size: "<src> --batch-size <b>".
    variants = {
        src if size is None else f"{src} --batch-size {size}": (src, size)
        for src in args.src.split(",")
        for size in sizes
    }
    sources = list(variants)
    with fresh_postgres("workercpu") as pg:
        runs = alternating.alternate(
            args.rounds,
            sources,
            lambda variant: one_run(
                pg,
                variants[variant][0],
                args.notifications,
                args.workers,
                batch_size=variants[variant][1],
            ),
            lambda run: (
                f"workers {run['worker_cpu_us']} us, PostgreSQL {run['postgres_cpu_us']} us"
                f" per notification (ratio {run['worker_over_postgres']});"
                f" {run['notifications_per_second']}/s"
            ),
        )
    figures = ("worker_cpu_us", "postgres_cpu_us", "worker_over_postgres")
    medians = alternating.medians(runs, sources, (*figures, "notifications_per_second"))
    alternating.write(
        args.output_dir,
        {
            "notifications": args.notifications,
            "workers": args.workers,
            "runs": runs,
            "medians": medians,
        },
    )


if __name__ == "__main__":
    main()
