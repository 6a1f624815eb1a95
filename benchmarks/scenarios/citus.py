"""10. PostgreSQL CPU per notification on the local Citus cluster against plain PostgreSQL, in the
same run with the same load (issue 21, docs/scaling.md "Citus: what the hop costs").

The cluster of tests/citus/cluster.py (a coordinator and two worker nodes, each its own
postmaster on this machine, built by `make citus`) serves both legs, so the binaries, the
settings and the machine are the same:

- `postgresql`: a database on the coordinator's server without the citus extension: every
  table local, the plain statements (the engine is PostgreSQL);
- `citus`: a database with the extension and both worker nodes registered: `migrate` lays the
  schema out distributed and every role runs the Citus statements.

Each leg is the `cost` scenario's user path at a smaller N: `notify-queue migrate`, one
`notify-queue api` process, N notifications through `POST /notifications/batch` (batches of 500,
each its own recipient and key, the default rate limit on, no webhook target), the API stopped,
then two `notify-queue worker` processes with default flags until every one is SENT. CPU is each
node's whole process tree (the postmaster, every live backend and background process, and the
CPU of the children it reaped: benchmarks.dbcost.postgres_cpu_seconds), so a worker node's
backends serving the coordinator are counted where they run. WAL is each node's insert LSN's
advance. Per notification: each node, and the nodes summed. The plain leg's worker nodes do no
work of that leg; their CPU then (Citus's maintenance daemons, the checkpointer) is reported as
`background`, not added to the plain figure; each node's idle CPU per second, measured first
for 10 s, is noted beside the figures.

Every node loads pg_stat_statements (`track = all`, on in both legs alike): the drain's
statements that took the most time on each node, with their calls and time per call, are
recorded beside the figures (`drain_statements`), which is how docs/scaling.md reads where the
Citus drain's time goes.

Without a Citus build (`make citus`, or NOTIFY_QUEUE_CITUS_PG_CONFIG) the scenario says so in one
line and records nothing.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from tests.citus.cluster import CitusCluster, CitusUnavailable, Node, find_pg_config

from benchmarks import queue
from benchmarks.burn import start_workers
from benchmarks.context import Context
from benchmarks.dbcost import postgres_cpu_seconds
from benchmarks.env import LoadWatch
from benchmarks.httpload import run_load
from benchmarks.procs import stop_all
from benchmarks.progress import Progress, say
from benchmarks.scenarios.cost import BATCH_CLIENTS, WORKERS, _batches
from benchmarks.scenarios.ingest import start_api

IDLE_SECONDS = 10.0
TOP_STATEMENTS = 8
# The drain's functions delegated to a worker node (citus/functions.sql): their calls there, the
# rows pg_stat_statements counted for them, and the rows each call served (docs/scaling.md "Fewer
# calls"). Matched on the top-level statements of the worker nodes (the call as the coordinator
# sent it); a claim's rows are its admission's (one row per claimed notification), a completion's
# are the rows its moves inserted into the log (nested INSERT statements).
DELEGATED = ("nq_claim_lock_bucket", "nq_claim_admit_bucket", "nq_complete_bucket")
LOG_INSERT = "INSERT INTO nq_delivery_log"
SENT_COUNT = "SELECT coalesce(sum(n), 0)::bigint FROM nq_counters WHERE name = 'notifications:SENT'"


def run(ctx: Context) -> None:
    try:
        pg_config = find_pg_config()
    except CitusUnavailable as reason:
        say(f"[citus] skipped: {reason}")
        ctx.notes.append(f"citus: skipped ({reason})")
        return
    n = ctx.sizes.citus_notifications
    with CitusCluster(ctx.workdir / "citus", pg_config, statements=True) as cluster:
        ctx.notes.append(
            f"citus: cluster of {len(cluster.workers)} worker nodes started in "
            f"{cluster.start_seconds or 0:.0f}s (fsync, synchronous_commit, full_page_writes off)"
        )
        with psycopg.connect(cluster.coordinator.url("postgres"), autocommit=True) as conn:
            conn.execute('CREATE DATABASE "nq_plain"')
        idle = _idle(cluster, IDLE_SECONDS)
        ctx.notes.append(f"citus: idle cluster, CPU µs per second per node: {idle}")
        legs = [
            ("postgresql", cluster.coordinator.url("nq_plain")),
            ("citus", cluster.create_database("nq_citus")),
        ]
        figures = {name: _leg(ctx, cluster, name, url, n) for name, url in legs}
    _print(figures, idle)


def _idle(cluster: CitusCluster, seconds: float) -> dict[str, float]:
    """What each node spends per second with no client: the floor under every figure."""
    a = _point(cluster)
    time.sleep(seconds)
    b = _point(cluster)
    return {k: round((b.cpu[k] - a.cpu[k]) * 1e6 / seconds, 1) for k in a.cpu}


@dataclass(frozen=True)
class _Point:
    cpu: dict[str, float]  # node name -> CPU seconds of its process tree
    wal: dict[str, str]  # node name -> insert LSN


def _point(cluster: CitusCluster) -> _Point:
    cpu, wal = {}, {}
    for node in cluster.nodes:
        pid = node.postmaster_pid()
        cpu[node.name] = postgres_cpu_seconds(pid) if pid else 0.0
        wal[node.name] = _lsn(node)
    return _Point(cpu, wal)


def _lsn(node: Node) -> str:
    with psycopg.connect(node.url("postgres"), autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    return str(row[0]) if row else "0/0"


def _wal_bytes(cluster: CitusCluster, a: _Point, b: _Point) -> dict[str, int]:
    out = {}
    with psycopg.connect(cluster.coordinator.url("postgres"), autocommit=True) as conn:
        for node in cluster.nodes:
            row = conn.execute(
                "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)::bigint",
                [b.wal[node.name], a.wal[node.name]],
            ).fetchone()
            out[node.name] = int(row[0]) if row else 0
    return out


def _per_notification(
    cluster: CitusCluster, name: str, a: _Point, b: _Point, units: int
) -> dict[str, Any]:
    """CPU µs and WAL bytes per notification, per node and summed over the nodes the leg uses
    (the coordinator alone for plain PostgreSQL: the others' CPU is `background`)."""
    used = [cluster.coordinator.name] if name == "postgresql" else [x.name for x in cluster.nodes]
    cpu = {k: (b.cpu[k] - a.cpu[k]) * 1e6 / units for k in a.cpu}
    wal = {k: v / units for k, v in _wal_bytes(cluster, a, b).items()}
    out: dict[str, Any] = {
        "cpu_us": round(sum(cpu[k] for k in used), 1),
        "wal_bytes": round(sum(wal[k] for k in used), 1),
        "cpu_us_per_node": {k: round(cpu[k], 1) for k in used},
        "wal_bytes_per_node": {k: round(wal[k], 1) for k in used},
    }
    background = [k for k in cpu if k not in used]
    if background:
        out["background_cpu_us_per_node"] = {k: round(cpu[k], 1) for k in background}
    return out


def _sent(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(SENT_COUNT).fetchone()
    return int(row[0]) if row else 0


def _leg(ctx: Context, cluster: CitusCluster, name: str, url: str, n: int) -> dict[str, Any]:
    say(f"[citus] {name}: {n:,} notifications through the API, then {WORKERS} workers")
    load = LoadWatch()
    queue.migrate(url)
    with psycopg.connect(url, autocommit=True) as conn:  # on Citus, on every node of the leg
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    nodes = [cluster.coordinator] if name == "postgresql" else cluster.nodes
    database = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    requests = _batches(n, name[:1])
    api, port = start_api(ctx, url, 1)
    try:
        p0 = _point(cluster)
        result = asyncio.run(
            run_load("127.0.0.1", port, requests, clients=BATCH_CLIENTS, keep_bodies=True)
        )
        p1 = _point(cluster)
    finally:
        api.stop()
    accepted = sum(
        sum(1 for x in json.loads(b)["results"] if x["status"] == 201) for b in result.bodies
    )
    if accepted != n:
        raise RuntimeError(f"{name}: {accepted} of {n} accepted; statuses {result.statuses}")
    procs = start_workers(ctx, url, WORKERS, webhooks=False, tag=f"citus-{name}-worker")
    bar = Progress(f"{name} W={WORKERS}", n)
    started = time.monotonic()
    try:
        # Drain from the workers' start: what a user's drain costs includes their start-up
        # statements (the engine read, the provider rows), as in the cost scenario.
        _reset_statements(nodes, str(database))
        p2 = _point(cluster)
        deadline = started + max(300.0, n / 10)
        while (sent := _sent(url)) < n:
            dead = [p for p in procs if not p.alive()]
            if dead:
                raise RuntimeError(f"{dead[0].name} exited:\n{dead[0].log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: {sent} of {n} SENT in time")
            bar.update(sent)
            time.sleep(0.5)
        drain_seconds = time.monotonic() - started
        p3 = _point(cluster)
        statements = {node.name: _top_statements(node, str(database)) for node in nodes}
        delegated = _delegated_calls(cluster, str(database)) if name == "citus" else None
    finally:
        stop_all(procs)
        bar.close()
    metrics: dict[str, Any] = {
        "engine": name,
        "notifications": n,
        "ingest": _per_notification(cluster, name, p0, p1, n),
        "drain": _per_notification(cluster, name, p2, p3, n),
        "batch_items_per_second": round(accepted / result.seconds, 1),
        "drain_notifications_per_second": round(n / drain_seconds, 1),
        "drain_statements": statements,
    }
    if delegated is not None:
        metrics["delegated_calls"] = delegated
    ingest, drain = metrics["ingest"], metrics["drain"]
    metrics["cpu_us_per_notification"] = round(ingest["cpu_us"] + drain["cpu_us"], 1)
    metrics["wal_bytes_per_notification"] = round(ingest["wal_bytes"] + drain["wal_bytes"], 1)
    metrics["cpu_us_per_node"] = {
        k: round(ingest["cpu_us_per_node"][k] + drain["cpu_us_per_node"][k], 1)
        for k in ingest["cpu_us_per_node"]
    }
    ctx.record(
        "citus",
        f"{name}, {n:,} notifications (API batch ingest, {WORKERS} workers)",
        metrics,
        load=load,
        params={"notifications": n, "workers": WORKERS, "batch_clients": BATCH_CLIENTS},
    )
    return metrics


def _reset_statements(nodes: list[Node], database: str) -> None:
    for node in nodes:
        with psycopg.connect(node.url(database), autocommit=True) as conn:
            conn.execute("SELECT pg_stat_statements_reset()")


def _top_statements(node: Node, database: str) -> list[dict[str, Any]]:
    """The statements of `database` that took the most execution time on `node` since the
    reset: calls, milliseconds per call and in all, the statement's first 160 characters."""
    with psycopg.connect(node.url(database), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT s.calls, s.total_exec_time, regexp_replace(s.query, '\\s+', ' ', 'g')"
            " FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
            " WHERE d.datname = %s ORDER BY s.total_exec_time DESC LIMIT %s",
            [database, TOP_STATEMENTS],
        ).fetchall()
    return [
        {
            "calls": int(calls),
            "ms_per_call": round(total / calls, 3) if calls else 0.0,
            "total_ms": round(total, 1),
            "query": str(query)[:160],
        }
        for calls, total, query in rows
    ]


def _delegated_calls(cluster: CitusCluster, database: str) -> dict[str, dict[str, Any]]:
    """Calls and rows of each delegated drain function, summed over the worker nodes, with the
    notifications each call served (`rows_per_call`)."""
    calls = dict.fromkeys(DELEGATED, 0)
    rows = dict.fromkeys(DELEGATED, 0)
    moved = 0
    for node in cluster.workers:
        with psycopg.connect(node.url(database), autocommit=True) as conn:
            for query, n_calls, n_rows, toplevel in conn.execute(
                "SELECT s.query, s.calls, s.rows, s.toplevel"
                " FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
                " WHERE d.datname = %s",
                [database],
            ).fetchall():
                text = str(query)
                if toplevel:
                    for function in DELEGATED:
                        if f"{function}(" in text:
                            calls[function] += int(n_calls)
                            rows[function] += int(n_rows)
                elif text.lstrip().startswith(LOG_INSERT):
                    moved += int(n_rows)
    served = {
        "nq_claim_lock_bucket": rows["nq_claim_admit_bucket"],
        "nq_claim_admit_bucket": rows["nq_claim_admit_bucket"],
        "nq_complete_bucket": moved,
    }
    return {
        f: {
            "calls": calls[f],
            "rows": rows[f],
            "rows_per_call": round(served[f] / calls[f], 1) if calls[f] else 0.0,
        }
        for f in DELEGATED
    }


def _print(figures: dict[str, dict[str, Any]], idle: dict[str, float]) -> None:
    plain, citus = figures["postgresql"], figures["citus"]
    rows = [
        ("PostgreSQL CPU per notification, all nodes", "cpu_us_per_notification", "µs"),
        ("WAL per notification, all nodes", "wal_bytes_per_notification", "B"),
        ("API batch ingest", "batch_items_per_second", "/s"),
        ("drain, 2 workers", "drain_notifications_per_second", "/s"),
    ]
    say("[citus] per notification, ingest + drain:")
    say(f"  {'':<44} {'PostgreSQL':>12} {'Citus':>12} {'ratio':>7}")
    for label, key, unit in rows:
        a, b = plain[key], citus[key]
        say(f"  {label:<44} {a:>10,.1f}{unit:<2} {b:>10,.1f}{unit:<2} {b / a if a else 0:>6.2f}x")
    for node, value in citus["cpu_us_per_node"].items():
        say(f"  Citus CPU on {node:<31} {value:>12,.1f}µs  (idle: {idle[node]:,.0f} µs/s)")
    for function, figures_ in citus.get("delegated_calls", {}).items():
        say(
            f"  Citus {function:<38} {figures_['calls']:>7,} calls"
            f" {figures_['rows_per_call']:>6.1f} rows a call"
        )
    for leg, figures_ in (("PostgreSQL", plain), ("Citus", citus)):
        for node, top in figures_["drain_statements"].items():
            say(f"[citus] {leg} drain, {node}: calls, ms per call, ms in all, statement")
            for st in top[:5]:
                calls, per_call, total = st["calls"], st["ms_per_call"], st["total_ms"]
                say(f"  {calls:>7,} {per_call:>9.3f} {total:>10,.1f}  {st['query'][:90]}")
