"""9. The database cost of a notification (issue 20), counted the way a user pays it, beside River
and pg-boss in the same run.

Notify Queue is driven only through its CLI and HTTP API: a fresh database, `notify-queue
migrate`, one `notify-queue api` process, N notifications through `POST /notifications/batch`
(batches of 500, every one with its own recipient and key, the default rate limit on, no webhook
target), the API stopped, then two `notify-queue worker` processes with default flags until
every notification is SENT. No SQL seeding and no ANALYZE: a burst that arrives through the API
is planned on whatever statistics autovacuum has gathered by then, as a user's is. The same
backlog is measured again with a manual `VACUUM (ANALYZE)` between ingest and drain (the
analysed/not-analysed pair); then one worker is watched idle, and 64 clients send as many
single `POST /notifications` as the batches carried (the client runs on the same 2 cores as the
server: its CPU is reported, and it takes from what the API and PostgreSQL get).

River and pg-boss insert the same number of jobs with their own client APIs (River `InsertMany`
in chunks of 5,000, pg-boss `insert` in chunks of 1,000) into their own fresh databases, without
ANALYZE either, and drain them: River as `river bench` does (one client, 2,000 workers), pg-boss
with two `work()` processes at batchSize 100 (our workers' claim size before it followed
--concurrency; kept so the pg-boss figures stay comparable across runs). Their schema
installation is not counted, as our `migrate` is not.

Then each system's finished work is cleaned up as its own maintenance would once past its
retention, counted as a phase of its own (`retention`), apart from the ingest + drain total the
targets read: our housekeeping forgets the keys of the log's partition and drops it; River's job
cleaner and pg-boss's deletion delete each finished job's row. The peers leave that row in their
table until then (24 h and 7 days by default), where our drain moves it to the log at once, so
ingest + drain counts our whole row work and only part of theirs; `with_retention` adds it.

Every figure comes from `benchmarks.dbcost` (how each is counted is written there) and is divided
by the notifications (jobs) the phase handled.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from benchmarks import dbcost, peers, queue
from benchmarks.burn import cpu_seconds, start_workers
from benchmarks.context import Context
from benchmarks.env import LoadWatch
from benchmarks.httpload import request_bytes, run_load
from benchmarks.procs import Proc, stop_all
from benchmarks.progress import Progress, say
from benchmarks.scenarios.ingest import SINGLE_CLIENTS, _item, _tree, single_requests, start_api
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery_log import DeliveryLogRepository
from notify_queue.settings import RetentionOptions

BATCH_ITEMS = 500
BATCH_CLIENTS = 2
WORKERS = 2
PGBOSS_BATCH_SIZE = 100
DEFAULT_RETENTION_DAYS = RetentionOptions.model_fields["retention"].default


def run(ctx: Context) -> None:
    n = ctx.sizes.cost_notifications
    admin = ctx.pg.url()
    server = dbcost.prepare_server(admin)
    ctx.notes.append(f"cost: server {server}")
    try:
        with_peers = not (ctx.mode == "smoke" and not (peers.NODE.exists() and peers.river_built()))
        if with_peers:
            peers.ensure_installed()
            if not peers.river_built():
                ctx.notes.append("cost: River skipped (no Go toolchain to build peers/river)")
        else:
            ctx.notes.append("cost: peers skipped in smoke mode (not installed)")
        rounds: list[dict[str, dict[str, Any]]] = []
        for i in range(ctx.sizes.cost_rounds):
            # The first round is recorded in full (every table of docs/performance.md); the
            # others add their headline figures to the round-by-round comparison.
            first = i == 0
            say(f"[cost] round {i + 1} of {ctx.sizes.cost_rounds}")
            this = {
                NOT_ANALYSED: ours(
                    ctx,
                    n,
                    analysed=False,
                    idle_seconds=ctx.sizes.cost_idle_seconds if first else 0.0,
                    record=first,
                ),
                ANALYSED: ours(ctx, n, analysed=True, record=first),
            }
            if with_peers and peers.river_built():
                this["River"] = river(ctx, n, record=first)
            if with_peers:
                this["pg-boss"] = pgboss(ctx, n, record=first)
            rounds.append(this)
        record_rounds(ctx, rounds)
        single_creates(ctx, n)
    finally:
        dbcost.release_server(admin)


NOT_ANALYSED = "notify-queue, not analysed"
ANALYSED = "notify-queue, after VACUUM (ANALYZE)"

# Each ratio of the comparison: (key, numerator's system, denominator's system, figure).
RATIOS = [
    ("postgres_cpu_vs_pgboss", NOT_ANALYSED, "pg-boss", "postgres_cpu_us"),
    ("postgres_cpu_vs_river", NOT_ANALYSED, "River", "postgres_cpu_us"),
    (
        "with_retention_postgres_cpu_vs_pgboss",
        NOT_ANALYSED,
        "pg-boss",
        "with_retention_postgres_cpu_us",
    ),
    (
        "with_retention_postgres_cpu_vs_river",
        NOT_ANALYSED,
        "River",
        "with_retention_postgres_cpu_us",
    ),
    ("wal_vs_river", NOT_ANALYSED, "River", "wal_bytes"),
    ("end_to_end_vs_river", NOT_ANALYSED, "River", "end_to_end_per_second"),
    ("postgres_cpu_not_analysed_vs_analysed", NOT_ANALYSED, ANALYSED, "postgres_cpu_us"),
]


def record_rounds(ctx: Context, rounds: list[dict[str, dict[str, Any]]]) -> None:
    """The headline figures of every round, each ratio within its round, and their medians."""
    table = []
    every: dict[str, list[float]] = {}
    for i, systems in enumerate(rounds, 1):
        figures = {name: _round_figures(m) for name, m in systems.items()}
        ratios = {}
        for key, a, b, figure in RATIOS:
            if a in figures and b in figures and figures[b][figure]:
                ratios[key] = round(figures[a][figure] / figures[b][figure], 3)
                every.setdefault(key, []).append(ratios[key])
        table.append({"round": i, "systems": figures, "ratios": ratios})
    medians = {key: round(statistics.median(values), 3) for key, values in every.items()}
    ctx.record(
        "cost",
        ROUNDS,
        {"rounds": table, "median_ratios": medians},
        load={},
        params={"rounds": len(rounds)},
    )


ROUNDS = "round by round"


def _round_figures(metrics: dict[str, Any]) -> dict[str, Any]:
    return {
        "postgres_cpu_us": metrics["headline"]["postgres_cpu_us"],
        "with_retention_postgres_cpu_us": metrics["headline"]["with_retention_postgres_cpu_us"],
        "wal_bytes": metrics["headline"]["wal_bytes"],
        **metrics["end_to_end"],
    }


def _end_to_end(n: int, ingest_seconds: float, drain_window_seconds: float) -> dict[str, float]:
    """Enqueue to done for a system already running: the ingest as its client timed it, then the
    drain from its first finished job to its last by the database's clock (the same definition
    for every system, so no one's process start-up counts: a Python worker's is 0.8 s)."""
    return {
        "ingest_seconds": round(ingest_seconds, 3),
        "drain_window_seconds": round(drain_window_seconds, 3),
        "end_to_end_per_second": round(n / (ingest_seconds + drain_window_seconds), 1),
    }


class _Database:
    """A fresh database with every statement tracked, and the observer on it."""

    def __init__(self, ctx: Context, prefix: str) -> None:
        self.ctx = ctx
        self.name = ctx.pg.database(prefix)
        self.url = ctx.pg.url(self.name)
        dbcost.prepare_database(ctx.pg.url(), self.name)
        self.observer: dbcost.Observer | None = None

    def observe(self) -> dbcost.Observer:
        pid = self.ctx.pg.server.pid
        assert pid is not None
        self.observer = dbcost.Observer(self.url, pid)
        return self.observer

    def close(self) -> None:
        if self.observer is not None:
            self.observer.close()
        self.ctx.pg.drop(self.name)


def _phases(
    ctx: Context,
    obs: dbcost.Observer,
    phases: list[tuple[dbcost.Phase, int]],
    *,
    wal_breakdown: bool = True,
) -> dict[str, Any]:
    """Each phase per unit, and the phases together as `total` (the WAL read back per record
    only with `wal_breakdown`: the round-by-round comparison needs the counters alone)."""
    out: dict[str, Any] = {}
    for phase, units in phases:
        if wal_breakdown and ctx.pg.server.pid is not None and phase.start_lsn != phase.end_lsn:
            try:
                dbcost.read_wal(ctx.pg.url(), obs, phase)
            except Exception as exc:  # the counters stand without the breakdown
                ctx.notes.append(f"cost: WAL not read back for {phase.name}: {exc}")
        out[phase.name] = dbcost.per_unit(phase, units)
    if len(phases) > 1:
        total = dbcost.combine("total", [p for p, _ in phases])
        out["total"] = dbcost.per_unit(total, max(u for _, u in phases))
    return out


def _batches(n: int, tag: str, size: int = BATCH_ITEMS) -> list[bytes]:
    """`n` plain creates with keys `<tag>-<hex>`, as batch requests of `size` items."""
    out = []
    for first in range(0, n, size):
        items = []
        for _ in range(first, min(first + size, n)):
            key = f"{tag}-{uuid.uuid4().hex}"
            items.append(_item(key) | {"idempotencyKey": key})
        body = json.dumps({"notifications": items}).encode()
        out.append(request_bytes("POST", "/notifications/batch", body))
    return out


def _drain(obs: dbcost.Observer, procs: list[Proc], total: int, label: str) -> None:
    """Until nothing is PENDING or PROCESSING (the observer's own reads are not counted)."""
    bar = Progress(label, total)
    deadline = time.monotonic() + max(120.0, total / 100)
    obs.conn.execute("SET enable_seqscan = off")
    try:
        while queue.any_unfinished(obs.conn):
            dead = [p for p in procs if not p.alive()]
            if dead:
                raise RuntimeError(f"{dead[0].name} exited:\n{dead[0].log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{label}: not drained in time")
            time.sleep(0.25)
        bar.update(total)
    finally:
        obs.conn.execute("RESET enable_seqscan")
        bar.close()


def ours(
    ctx: Context, n: int, *, analysed: bool, idle_seconds: float = 0.0, record: bool = True
) -> dict[str, Any]:
    variant = "after VACUUM (ANALYZE)" if analysed else "not analysed"
    say(f"[cost] notify-queue, {n:,} notifications through the API, {variant}")
    db = _Database(ctx, "cost")
    load = LoadWatch()
    try:
        queue.migrate(db.url)
        # Part of the installation, uncounted as `migrate` is: the partitions `migrate` makes for
        # the past 35 days (0008, for an upgrade's history) that are already past the default
        # retention go at the first worker's housekeeping. A fresh install pays it once; counted,
        # it was 3-5 µs per notification of the drain (five DETACH CONCURRENTLY and DROP).
        asyncio.run(_retention(db.url, retention_seconds=DEFAULT_RETENTION_DAYS * 86_400))
        requests = _batches(n, "a" if analysed else "d")
        api, port = start_api(ctx, db.url, 1)
        obs = db.observe()
        try:
            api_pids = _tree(api.pid)
            api_cpu = -cpu_seconds(api_pids)
            s0 = obs.snapshot()
            result = asyncio.run(
                run_load("127.0.0.1", port, requests, clients=BATCH_CLIENTS, keep_bodies=True)
            )
            api_cpu += cpu_seconds(api_pids)
        finally:
            api.stop()
        accepted = sum(
            sum(1 for x in json.loads(b)["results"] if x["status"] == 201) for b in result.bodies
        )
        if accepted != n:
            raise RuntimeError(f"{accepted} of {n} accepted; statuses {result.statuses}")
        obs.wait_for_backends_gone()
        s1 = drain_from = obs.snapshot()
        if analysed:
            # Not counted in either phase: what the figure compares is the drain's plans.
            obs.conn.execute("VACUUM (ANALYZE)")
            drain_from = obs.snapshot()
        planner_rows = _planner_rows(obs)
        procs = start_workers(ctx, db.url, WORKERS, webhooks=False, tag="cost-worker")
        try:
            _drain(obs, procs, n, f"notify-queue W={WORKERS} {variant}")
        finally:
            stop_all(procs)
        obs.wait_for_backends_gone()
        s2 = obs.snapshot()
        # What was sent, and the drain's window: first finished to last, by the database's clock.
        row = obs.conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'SENT'), count(*),"
            " extract(epoch FROM max(finished_at) - min(finished_at)) FROM nq_all_notifications"
        ).fetchone()
        assert row is not None
        sent, stored = int(row[0]), int(row[1])
        window = float(row[2]) if row[2] is not None else 0.0
        idle = _idle(ctx, db, obs, idle_seconds) if idle_seconds else None
        # The empty partitions `migrate` made for the past days go first, uncounted: a running
        # installation drops one day's partition at a time, not the month before the benchmark.
        asyncio.run(_retention(db.url, retention_seconds=0))
        obs.wait_for_backends_gone()
        ingest_phase = obs.diff("ingest", s0, s1)
        drain_phase = obs.diff("drain", drain_from, s2)
        metrics = _phases(
            ctx, obs, [(ingest_phase, accepted), (drain_phase, sent)], wal_breakdown=record
        )
        metrics |= _retention_phase(ctx, obs, lambda: _forget_today(db.url), n, record=record)
        metrics |= {
            "system": "notify-queue",
            "variant": variant,
            "notifications": n,
            "sent": sent,
            "stored": stored,
            "batch_items_per_second": round(accepted / result.seconds, 1),
            "api_cpu_us_per_item": round(api_cpu / accepted * 1e6, 1),
            "end_to_end": _end_to_end(n, result.seconds, window),
            # What the planner believed when the drain started: -1 is never analysed nor
            # vacuumed. Autovacuum may have analysed the queue during a slow ingest (a loaded
            # machine): then "not analysed" is not, and the pair compares little.
            "planner_rows_at_drain_start": planner_rows,
            "headline": _headline(metrics),
        }
        if idle is not None:
            metrics["idle"] = idle
        if record:
            ctx.record(
                "cost",
                f"notify-queue, {variant}",
                metrics,
                load=load,
                params={
                    "batch_items": BATCH_ITEMS,
                    "batch_clients": BATCH_CLIENTS,
                    "workers": WORKERS,
                    "worker_flags": ctx.worker_args or "defaults, no webhook target",
                    "api_workers": 1,
                },
            )
        return metrics
    finally:
        db.close()


async def _retention(url: str, *, retention_seconds: float) -> int:
    """What the workers' housekeeping does with each partition of the log past the retention
    (`DeliveryLogKeeper`): forget its keys in chunks, detach it, drop it; how many notifications
    it dropped. A retention of minus one day counts today's partition as past it."""
    db = Database(url, pool_size=2, name="notify-queue-worker")
    await db.open()
    try:
        repository = DeliveryLogRepository(db)
        dropped = await repository.partitions_drop_expired(retention_seconds=retention_seconds)
    finally:
        await db.close()
    return sum(d.rows for d in dropped)


def _forget_today(url: str) -> None:
    if not asyncio.run(_retention(url, retention_seconds=-86_400)):
        raise RuntimeError("retention forgot no notification")


def _retention_phase(
    ctx: Context, obs: dbcost.Observer, clean: Callable[[], object], units: int, *, record: bool
) -> dict[str, Any]:
    """`clean` (a system's own cleanup of its finished work) counted as the `retention` phase."""
    before = obs.snapshot()
    clean()
    obs.wait_for_backends_gone()
    return _phases(
        ctx, obs, [(obs.diff("retention", before, obs.snapshot()), units)], wal_breakdown=record
    )


# River's job cleaner (river 0.51.2: riverdriver/riverpgxv5/internal/dbsqlc/river_job.sql,
# JobDeleteBefore), what River runs, one statement per batch of
# riversharedmaintenance.BatchSizeDefault (10,000), once completed jobs are past
# CompletedJobRetentionPeriod (24 h by default). Sent from here with River's parameters: the
# server's work is River's; only its client differs.
RIVER_JOB_CLEANER = """
DELETE FROM river_job
WHERE id IN (
    SELECT id
    FROM river_job
    WHERE (
            (state = 'cancelled' AND %(cancelled_do_delete)s AND finalized_at < %(cancelled_finalized_at_horizon)s::timestamptz) OR
            (state = 'completed' AND %(completed_do_delete)s AND finalized_at < %(completed_finalized_at_horizon)s::timestamptz) OR
            (state = 'discarded' AND %(discarded_do_delete)s AND finalized_at < %(discarded_finalized_at_horizon)s::timestamptz)
        )
        AND (
            %(queues_excluded)s::text[] IS NULL
            OR NOT (queue = any(%(queues_excluded)s))
        )
        AND (
            %(queues_included)s::text[] IS NULL
            OR queue = any(%(queues_included)s)
        )
    ORDER BY id
    LIMIT %(max)s::bigint
)"""  # noqa: E501
RIVER_CLEANER_BATCH = 10_000


def _river_cleaner(url: str) -> None:
    """River's job cleaner over every completed job, batch by batch until a batch is short."""
    horizon = datetime.now(UTC) + timedelta(seconds=1)
    params = {
        "cancelled_do_delete": False,
        "cancelled_finalized_at_horizon": horizon,
        "completed_do_delete": True,
        "completed_finalized_at_horizon": horizon,
        "discarded_do_delete": False,
        "discarded_finalized_at_horizon": horizon,
        "queues_excluded": None,
        "queues_included": None,
        "max": RIVER_CLEANER_BATCH,
    }
    with psycopg.connect(url, autocommit=True) as conn:
        while conn.execute(RIVER_JOB_CLEANER, params).rowcount == RIVER_CLEANER_BATCH:
            pass


def _planner_rows(obs: dbcost.Observer) -> dict[str, float]:
    rows = obs.conn.execute(
        "SELECT relname, reltuples FROM pg_class WHERE relkind IN ('r', 'p')"
        " AND relnamespace = 'public'::regnamespace AND relname LIKE 'nq\\_%%'"
        " AND NOT relispartition"
    ).fetchall()
    return {r[0]: float(r[1]) for r in rows}


def _idle(ctx: Context, db: _Database, obs: dbcost.Observer, seconds: float) -> dict[str, Any]:
    """One worker with nothing to do: statements per second and which ones."""
    say(f"[cost] one idle worker, {seconds:.0f} s")
    procs = start_workers(ctx, db.url, 1, webhooks=False, tag="cost-idle")
    try:
        deadline = time.monotonic() + 60
        while True:
            row = obs.conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name LIKE 'notify-queue-listen%%' AND query LIKE 'LISTEN%%'"
            ).fetchone()
            if row and row[0] >= 1:
                break
            if time.monotonic() > deadline or not procs[0].alive():
                raise RuntimeError(f"the idle worker did not start:\n{procs[0].log_tail()}")
            time.sleep(0.1)
        # Past start-up: its first polls and timers have run.
        time.sleep(2.0)
        a = obs.snapshot()
        time.sleep(seconds)
        b = obs.snapshot()
    finally:
        stop_all(procs)
    phase = obs.diff("idle", a, b)
    calls = sum(
        s["calls"] for s in phase.statements if s["toplevel"] and not dbcost.is_foreign_key_check(s)
    )
    return {
        "seconds": round(phase.seconds, 1),
        "statements": calls,
        "statements_per_second": round(calls / phase.seconds, 3),
        "postgres_cpu_ms_per_second": round(phase.cpu_seconds * 1000 / phase.seconds, 2),
        "wal_bytes": phase.wal_bytes,
        "which": [
            {
                "query": s["query"],
                "toplevel": s["toplevel"],
                "calls": s["calls"],
                "per_second": round(s["calls"] / phase.seconds, 3),
            }
            for s in sorted(phase.statements, key=lambda s: -s["calls"])
        ],
    }


def single_creates(ctx: Context, n: int) -> None:
    """64 clients, `n` single POST /notifications: as many as the batch leg inserts, so the two
    legs' PostgreSQL cost per item is counted on tables of the same size (a leg of 30 s put six
    times the rows in, and autovacuum's passes over them into its window)."""
    say(f"[cost] single POST /notifications, {SINGLE_CLIENTS} clients, {n:,} creates")
    db = _Database(ctx, "cost_single")
    load = LoadWatch()
    try:
        queue.migrate(db.url)
        requests = single_requests(n)  # each with its own key and recipient
        api, port = start_api(ctx, db.url, 1)
        obs = db.observe()
        try:
            api_pids = _tree(api.pid)
            api_cpu = -cpu_seconds(api_pids)
            s0 = obs.snapshot()
            result = asyncio.run(run_load("127.0.0.1", port, requests, clients=SINGLE_CLIENTS))
            api_cpu += cpu_seconds(api_pids)
        finally:
            api.stop()
        obs.wait_for_backends_gone()
        s1 = obs.snapshot()
        created = result.statuses.get(201, 0)
        phase = obs.diff("single", s0, s1)
        metrics = _phases(ctx, obs, [(phase, created)])
        metrics |= {
            "system": "notify-queue",
            "variant": "single POST /notifications",
            "created": created,
            "errors": {str(s): c for s, c in result.statuses.items() if s != 201},
            "creates_per_second": round(created / result.seconds, 1),
            "api_cpu_us_per_create": round(api_cpu / created * 1e6, 1) if created else None,
            "client_cpu_us_per_create": round(result.client_cpu_seconds / created * 1e6, 1)
            if created
            else None,
            "client": "benchmarks.httpload on the same machine",
        }
        ctx.record(
            "cost",
            "notify-queue, single POST /notifications",
            metrics,
            load=load,
            params={"clients": SINGLE_CLIENTS, "creates": n, "api_workers": 1},
        )
    finally:
        db.close()


def _run(command: list[str], peer: str) -> float:
    """Run a peer's command; the seconds it took (its process start-up included: a few ms for
    River's Go binary, more for node and pg-boss's start, which only counts against pg-boss)."""
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, cwd=peers.PEERS, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{peer} {command[1:3]} failed: {done.stderr[-2000:]}")
    return time.monotonic() - started


def river(ctx: Context, n: int, *, record: bool = True) -> dict[str, Any]:
    say(f"[cost] River, {n:,} jobs (InsertMany, then one client of 2,000 workers)")
    db = _Database(ctx, "river_cost")
    load = LoadWatch()
    try:
        _run([str(peers.RIVER), "migrate", db.url], "river")
        obs = db.observe()
        s0 = obs.snapshot()
        ingest_seconds = _run([str(peers.RIVER), "insert", db.url, str(n)], "river")
        obs.wait_for_backends_gone()
        s1 = obs.snapshot()
        proc = Proc(
            f"river-cost-{time.time_ns()}", [str(peers.RIVER), "work", db.url, str(n)], ctx.logdir
        )
        try:
            proc.popen.wait(max(120.0, n / 100))
        finally:
            stop_all([proc])
        obs.wait_for_backends_gone()
        s2 = obs.snapshot()
        return _peer_metrics(
            ctx,
            obs,
            "River",
            (s0, s1, s2),
            n,
            ingest_seconds,
            "SELECT count(*) FILTER (WHERE state = 'completed'),"
            " extract(epoch FROM max(finalized_at) - min(finalized_at)) FROM river_job",
            clean=lambda: _river_cleaner(db.url),
            record=record,
            load=load,
            params={"insert": "InsertMany, 5,000 per call", "clients": 1, "max_workers": 2000},
        )
    finally:
        db.close()


def pgboss(ctx: Context, n: int, *, record: bool = True) -> dict[str, Any]:
    say(f"[cost] pg-boss, {n:,} jobs (insert, then {WORKERS} work() processes)")
    db = _Database(ctx, "pgboss_cost")
    load = LoadWatch()
    node = [str(peers.NODE), str(peers.PGBOSS_SCRIPT)]
    try:
        _run([*node, "migrate", ctx.pg.socket_dir, db.name], "pg-boss")
        obs = db.observe()
        s0 = obs.snapshot()
        ingest_seconds = _run([*node, "insert", ctx.pg.socket_dir, db.name, str(n)], "pg-boss")
        obs.wait_for_backends_gone()
        s1 = obs.snapshot()
        procs = [
            Proc(
                f"pgboss-cost-{i}-{time.time_ns()}",
                [*node, "work", ctx.pg.socket_dir, db.name, str(PGBOSS_BATCH_SIZE), "1"],
                ctx.logdir,
                cwd=peers.PEERS,
            )
            for i in range(WORKERS)
        ]
        bar = Progress(f"pg-boss W={WORKERS} batchSize={PGBOSS_BATCH_SIZE}", n)
        try:
            deadline = time.monotonic() + max(120.0, n / 100)
            while True:
                row = obs.conn.execute(
                    "SELECT EXISTS (SELECT 1 FROM pgboss.job WHERE name = 'bench'"
                    " AND state <> 'completed')"
                ).fetchone()
                if not (row and row[0]):
                    break
                dead = [p for p in procs if not p.alive()]
                if dead:
                    raise RuntimeError(f"{dead[0].name} exited:\n{dead[0].log_tail()}")
                if time.monotonic() > deadline:
                    raise RuntimeError("pg-boss: not drained in time")
                time.sleep(0.25)
            bar.update(n)
        finally:
            bar.close()
            stop_all(procs)
        obs.wait_for_backends_gone()
        s2 = obs.snapshot()
        return _peer_metrics(
            ctx,
            obs,
            "pg-boss",
            (s0, s1, s2),
            n,
            ingest_seconds,
            "SELECT count(*) FILTER (WHERE state = 'completed'),"
            " extract(epoch FROM max(completed_on) - min(completed_on)) FROM pgboss.job"
            " WHERE name = 'bench'",
            clean=lambda: _run([*node, "clean", ctx.pg.socket_dir, db.name], "pg-boss"),
            record=record,
            load=load,
            params={
                "insert": "boss.insert, 1,000 per call",
                "workers": WORKERS,
                "batch_size": PGBOSS_BATCH_SIZE,
            },
        )
    finally:
        db.close()


def _peer_metrics(
    ctx: Context,
    obs: dbcost.Observer,
    name: str,
    snapshots: tuple[dbcost.Snapshot, dbcost.Snapshot, dbcost.Snapshot],
    jobs: int,
    ingest_seconds: float,
    finished_sql: str,
    *,
    clean: Callable[[], object],
    record: bool,
    load: LoadWatch,
    params: dict[str, Any],
) -> dict[str, Any]:
    """A peer's figures per job from its ingest (before, after) and drain (after, done)
    snapshots; `finished_sql` reads its completed jobs and the drain window (first to last
    finished, by the database's clock); then `clean` deletes its finished jobs as its own
    maintenance would, counted apart as the retention phase. Recorded under `name` with
    `record`."""
    s0, s1, s2 = snapshots
    row = obs.conn.execute(finished_sql).fetchone()
    done = int(row[0]) if row else 0
    window = float(row[1]) if row and row[1] is not None else 0.0
    metrics = _phases(
        ctx,
        obs,
        [(obs.diff("ingest", s0, s1), jobs), (obs.diff("drain", s1, s2), done)],
        wal_breakdown=record,
    )
    metrics |= _retention_phase(ctx, obs, clean, jobs, record=record)
    metrics |= {
        "system": name.lower(),
        "variant": "",
        "jobs": jobs,
        "completed": done,
        "end_to_end": _end_to_end(jobs, ingest_seconds, window),
    }
    metrics["headline"] = _headline(metrics)
    if record:
        ctx.record("cost", name, metrics, load=load, params=params)
    return metrics


def _headline(metrics: dict[str, Any]) -> dict[str, Any]:
    """The figures the summary table compares, ingest + drain per notification."""
    total = metrics.get("total", {})
    rows = total.get("row_versions", {})
    retention = metrics.get("retention", {})
    return {
        "postgres_cpu_us": total.get("postgres_cpu_us"),
        # What each system pays later for a finished job: ours forgets its key and drops the log's
        # partition, River's cleaner and pg-boss's maintenance delete the job's row.
        "retention_postgres_cpu_us": retention.get("postgres_cpu_us"),
        "with_retention_postgres_cpu_us": round(
            total["postgres_cpu_us"] + retention["postgres_cpu_us"], 1
        )
        if "postgres_cpu_us" in total and "postgres_cpu_us" in retention
        else None,
        "retention_wal_bytes": retention.get("wal_bytes"),
        "ingest_postgres_cpu_us": metrics.get("ingest", {}).get("postgres_cpu_us"),
        "drain_postgres_cpu_us": metrics.get("drain", {}).get("postgres_cpu_us"),
        "wal_bytes": total.get("wal_bytes"),
        "wal_fpi": total.get("wal_fpi"),
        "statements": total.get("statements"),
        "nested_statements": total.get("nested_statements"),
        "foreign_key_checks": total.get("foreign_key_checks"),
        "inserts": rows.get("ins"),
        "updates": rows.get("upd"),
        "hot_updates": rows.get("hot_upd"),
        "deletes": rows.get("del"),
        "index_entries": total.get("index_entries"),
        "drain_plans": metrics.get("drain", {}).get("plans"),
        "drain_planning_us": metrics.get("drain", {}).get("planning_us"),
    }
