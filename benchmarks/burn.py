"""A due-job burn-down on Notify Queue: N notifications already due, W `notify-queue worker`
processes, measured from the first claim to the last SENT (and to the last webhook delivered).

The workers are started after the rows are seeded and the table vacuumed; since the figures come
from the database's timestamps, process start-up is not part of them.
"""

from __future__ import annotations

import time
from typing import Any

import psutil
import psycopg

from benchmarks import queue
from benchmarks.context import Context
from benchmarks.env import LoadWatch
from benchmarks.procs import Proc, notify_queue, stop_all
from benchmarks.progress import Progress


def worker_args(
    ctx: Context,
    url: str,
    *,
    webhooks: bool = True,
    relay: bool = True,
    extra: list[str] | None = None,
) -> list[str]:
    """`webhooks`: a webhook URL, so every final status writes an event row; `relay`: the workers
    also POST them (off: the rows are written and stay for `notify-queue relay` processes)."""
    args = ["--database-url", url, "--log-level", "WARNING"]
    if webhooks:
        args += ["--webhook-url", ctx.receiver.url, "--outbound-allow", "127.0.0.0/8"]
        if not relay:
            args += ["--webhook-dispatch", "off"]
    return args + ctx.worker_args + (extra or [])


def start_workers(
    ctx: Context,
    url: str,
    count: int,
    *,
    webhooks: bool = True,
    relay: bool = True,
    extra: list[str] | None = None,
    tag: str = "worker",
) -> list[Proc]:
    return [
        notify_queue(
            "worker",
            worker_args(ctx, url, webhooks=webhooks, relay=relay, extra=extra),
            ctx.logdir,
            f"{tag}-{i}-{time.time_ns()}",
        )
        for i in range(count)
    ]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these live processes (gone ones count nothing)."""
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def postgres_pids(ctx: Context) -> list[int]:
    """The server and every backend: the postmaster's children."""
    pid = ctx.pg.server.pid
    if pid is None:
        return []
    try:
        return [pid, *(c.pid for c in psutil.Process(pid).children())]
    except psutil.Error:
        return []


class CpuSplit:
    """Where the CPU went during a run: PostgreSQL, the workers (or the relay), the receiver.

    Read just before the workers stop (their backends exit with them). Backends that came and
    went during the run are missed, so the PostgreSQL figure is a floor."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._pg_before = {pid: cpu_seconds([pid]) for pid in postgres_pids(ctx)}
        self._receiver_before = cpu_seconds([ctx.receiver.proc.pid])

    def finish(
        self,
        workers: list[Proc],
        delivered: int,
        *,
        label: str = "workers",
        unit: str = "notification",
    ) -> dict[str, Any]:
        """`label` names the measured processes (`workers`, `relay`), `unit` what `delivered`
        counts."""
        pg_now = {pid: cpu_seconds([pid]) for pid in postgres_pids(self._ctx)}
        postgres = sum(v - self._pg_before.get(pid, 0.0) for pid, v in pg_now.items())
        worker = cpu_seconds([p.pid for p in workers])
        receiver = cpu_seconds([self._ctx.receiver.proc.pid]) - self._receiver_before
        per = (lambda x: round(x / delivered * 1e6, 1)) if delivered else (lambda x: None)
        return {
            "cpu_seconds": {
                "postgres": round(postgres, 2),
                label: round(worker, 2),
                "receiver": round(receiver, 2),
            },
            f"cpu_us_per_{unit}": {
                "postgres": per(postgres),
                label: per(worker),
                "receiver": per(receiver),
            },
        }


def wait_until_listening(url: str, workers: int, timeout_seconds: float = 60.0) -> None:
    """Until `workers` processes hold their LISTEN connection: started, connected and awake to
    wake-ups, so a latency figure never includes a worker's start-up."""
    deadline = time.monotonic() + timeout_seconds
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name LIKE 'notify-queue-listen%%' AND query LIKE 'LISTEN%%'"
            ).fetchone()
            if row and row[0] >= workers:
                return
            time.sleep(0.1)
    raise RuntimeError(f"{workers} workers did not start listening within {timeout_seconds:.0f}s")


def top_statements(conn: psycopg.Connection[Any], limit: int = 6) -> list[dict[str, Any]]:
    """The statements that took the most server time (pg_stat_statements), for the profile."""
    rows = conn.execute(
        """SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 90), calls,
                  round(total_exec_time::numeric, 1),
                  round(mean_exec_time::numeric, 3), rows, shared_blks_hit, shared_blks_read
           FROM pg_stat_statements
           WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
           ORDER BY total_exec_time DESC LIMIT %s""",
        (limit,),
    ).fetchall()
    return [
        {
            "query": r[0],
            "calls": r[1],
            "total_ms": float(r[2]),
            "mean_ms": float(r[3]),
            "rows": r[4],
            "blks_hit": r[5],
            "blks_read": r[6],
        }
        for r in rows
    ]


def burn_down(
    ctx: Context,
    *,
    label: str,
    notifications: int,
    workers: int,
    webhooks: bool = True,
    relay: bool = True,
    extra: list[str] | None = None,
    timeout_seconds: float | None = None,
) -> dict[str, Any]:
    """Seed, burn down, measure; return the figures (and drop the database)."""
    name = ctx.pg.database("nq")
    url = ctx.pg.url(name)
    try:
        queue.migrate(url)
        seeding = Progress(f"{label}: seeding", notifications)
        queue.seed_due(url, notifications, progress=seeding.update)
        seeding.close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_statements_reset()")
        load = LoadWatch()
        cpu = CpuSplit(ctx)
        procs = start_workers(ctx, url, workers, webhooks=webhooks, relay=relay, extra=extra)
        split: dict[str, Any] = {}
        timeout = timeout_seconds or max(120.0, notifications / 300)
        bar = Progress(label, notifications)
        deadline = time.monotonic() + timeout
        timed_out = False
        try:
            with queue.watcher(url) as conn:
                last_count = 0.0
                while True:
                    # Existence checks are nearly free; a real count only every few seconds,
                    # because counting 100,000 rows competes with the workers being measured.
                    busy = queue.any_unfinished(conn)
                    hooks = webhooks and relay and queue.any_webhook_pending(conn)
                    if not busy and not hooks:
                        break
                    if time.monotonic() - last_count > 3.0:
                        last_count = time.monotonic()
                        bar.update(
                            notifications - queue.unfinished(conn) if busy else notifications,
                            note="webhooks pending" if hooks else "",
                        )
                    dead = [p for p in procs if not p.alive()]
                    if dead:
                        raise RuntimeError(f"{dead[0].name} exited:\n{dead[0].log_tail()}")
                    if time.monotonic() > deadline:
                        timed_out = True
                        break
                    time.sleep(0.25)
            split = cpu.finish(procs, notifications)
        finally:
            bar.close()
            stop_all(procs)
        with psycopg.connect(url, autocommit=True) as conn:
            figures = queue.burn_down_figures(conn) | split
            figures["top_statements"] = top_statements(conn)
        figures["timed_out"] = timed_out
        figures["load"] = load.finish()
        return figures
    finally:
        ctx.pg.drop(name)
