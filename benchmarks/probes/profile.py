"""Profile one burn-down.

    python -m benchmarks.probes.profile [--notifications N] [--workers W] [-- worker flags]


Seeds N due notifications on a fresh embedded PostgreSQL, starts W workers (rate limiting and
webhooks on, as in the throughput scenario), attaches py-spy to the first worker for the whole
burn-down, and prints the hottest functions (own time and total time) and the statements that
took the most server time (pg_stat_statements). Needs `pip install py-spy` in the venv.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from benchmarks import queue
from benchmarks.burn import start_workers, top_statements
from benchmarks.context import QUICK, Context
from benchmarks.env import BenchPostgres
from benchmarks.procs import Receiver, stop_all


def summarise(raw: Path, top: int = 25) -> str:
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        samples += n
        frames = stack.split(";")
        own[frames[-1]] += n
        for f in set(frames):
            total[f] += n
    out = [f"{samples} samples", "-- own time --"]
    out += [f"{c / samples:6.1%}  {f}" for f, c in own.most_common(top)]
    out += ["-- total time --"]
    out += [f"{c / samples:6.1%}  {f}" for f, c in total.most_common(top)]
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--notifications", type=int, default=50_000)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--no-webhooks", action="store_true")
    p.add_argument("--out", type=Path, default=Path("/tmp/nq-profile"))
    p.add_argument("worker_flags", nargs="*")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="nq-prof-"))
    pg = BenchPostgres(workdir)
    receiver = Receiver(workdir)
    ctx = Context("profile", QUICK, pg, workdir, receiver, args.worker_flags)
    try:
        name = pg.database("prof")
        url = pg.url(name)
        queue.migrate(url)
        queue.seed_due(url, args.notifications)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_statements_reset()")
        procs = start_workers(ctx, url, args.workers, webhooks=not args.no_webhooks)
        time.sleep(1.0)
        raw = args.out / "worker0.txt"
        spy = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "py-spy"),
                "record",
                "--pid",
                str(procs[0].pid),
                "--format",
                "raw",
                "--output",
                str(raw),
                "--rate",
                "250",
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        t0 = time.monotonic()
        with queue.watcher(url) as conn:
            while queue.any_unfinished(conn) or (
                not args.no_webhooks and queue.any_webhook_pending(conn)
            ):
                time.sleep(0.2)
            spy.send_signal(__import__("signal").SIGINT)
            spy.wait(30)
            figures = queue.burn_down_figures(conn)
            statements = top_statements(conn, 8)
        stop_all(procs)
        print(f"burn-down {time.monotonic() - t0:.1f}s: {figures}")
        for s in statements:
            print(
                f"  {s['total_ms']:>9.1f} ms {s['calls']:>6} calls "
                f"{s['mean_ms']:.3f} ms/call  {s['query']}"
            )
        if raw.exists():
            print(summarise(raw))
    finally:
        receiver.stop()
        pg.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
