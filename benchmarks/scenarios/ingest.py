"""2. Ingest through the HTTP API (`notify-queue api`, no workers running): `POST /notifications`
one at a time from 64 concurrent keep-alive clients, and `POST /notifications/batch` with 1,000
notifications per call; accepted (201) per second, each request's time, and where the CPU went.

The load comes from `benchmarks.httpload`, a raw-asyncio client with every request built before
the clock starts, because an aiohttp client at thousands of requests a second would use as much
CPU as the API it measures on this 2-core machine. The CPU split per accepted notification is
measured for the API process(es), the PostgreSQL server and its backends, and the client itself,
so a figure can be read against what limited it; `statements_per_request` counts the database
round trips (pg_stat_statements calls over requests; for single creates its inverse,
`creates_per_statement`, says how well they were coalesced). `postgres_cpu_us_per_item` and
`api_cpu_us_per_item` are the CPU per accepted notification, single and batch alike.

The API runs with one process (the issue-10 target: one process, 64 clients) and with
`--api-workers 2` (one uvicorn process per core), so the figure per process is visible.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from typing import Any

import aiohttp
import psutil
import psycopg

from benchmarks import queue
from benchmarks.burn import cpu_seconds, postgres_pids, top_statements
from benchmarks.context import Context
from benchmarks.env import LoadWatch
from benchmarks.httpload import LoadResult, request_bytes, run_load
from benchmarks.procs import Proc, notify_queue
from benchmarks.progress import Progress, say

SINGLE_CLIENTS = 64
BATCH_CLIENTS = 2
BATCH_SIZE = 1000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _item(key: str) -> dict[str, Any]:
    return {
        "channel": "email",
        "recipient": f"{key}@example.com",
        "subject": "Your receipt",
        "body": "x" * 120,
        "priority": "NORMAL",
    }


async def _wait_ready(base: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(f"{base}/readyz") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the API did not become ready")
            await asyncio.sleep(0.2)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(int(q * len(values)), len(values) - 1)] * 1000, 1)


class _CpuWatch:
    """CPU seconds of the API process tree and of PostgreSQL (postmaster and backends) over a
    measurement. Read before the API stops, while its backends still exist."""

    def __init__(self, ctx: Context, api: Proc) -> None:
        self._ctx = ctx
        self._api_pids = _tree(api.pid)
        self._api_before = cpu_seconds(self._api_pids)
        self._pg_before = {pid: cpu_seconds([pid]) for pid in postgres_pids(ctx)}

    def finish(self, load: LoadResult, accepted: int) -> dict[str, Any]:
        api = cpu_seconds(self._api_pids) - self._api_before
        pg_now = {pid: cpu_seconds([pid]) for pid in postgres_pids(self._ctx)}
        postgres = sum(v - self._pg_before.get(pid, 0.0) for pid, v in pg_now.items())
        client = load.client_cpu_seconds
        per = (lambda x: round(x / accepted * 1e6, 1)) if accepted else (lambda x: None)
        return {
            # Scalars for the table: PostgreSQL's CPU per accepted notification is the figure the
            # single path is held to (no more than the batch path's), the API's is what limits it.
            "postgres_cpu_us_per_item": per(postgres),
            "api_cpu_us_per_item": per(api),
            "cpu_seconds": {
                "api": round(api, 2),
                "postgres": round(postgres, 2),
                "client": round(client, 2),
            },
            "cpu_us_per_notification": {
                "api": per(api),
                "postgres": per(postgres),
                "client": per(client),
            },
        }


def _tree(pid: int) -> list[int]:
    """The API process and its children (uvicorn's workers with --api-workers > 1)."""
    try:
        return [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        return [pid]


def single_requests(total: int) -> list[bytes]:
    """`total` distinct creates, each with its own key in the Idempotency-Key header."""
    out = []
    for _ in range(total):
        key = uuid.uuid4().hex
        out.append(
            request_bytes(
                "POST",
                "/notifications",
                json.dumps(_item(key)).encode(),
                {"Idempotency-Key": key},
            )
        )
    return out


def batch_requests(count: int) -> list[bytes]:
    return [
        request_bytes(
            "POST",
            "/notifications/batch",
            json.dumps(
                {
                    "notifications": [
                        _item(k) | {"idempotencyKey": k}
                        for k in (uuid.uuid4().hex for _ in range(BATCH_SIZE))
                    ]
                }
            ).encode(),
        )
        for _ in range(count)
    ]


async def single(port: int, total: int, clients: int = SINGLE_CLIENTS) -> LoadResult:
    requests = single_requests(total)
    bar = Progress(f"POST /notifications x{total:,}, {clients} clients", total)
    done = 0

    def tick(status: int) -> None:
        nonlocal done
        done += 1
        if done % 500 == 0:
            bar.update(done)

    load = await run_load("127.0.0.1", port, requests, clients=clients, on_response=tick)
    bar.close()
    return load


def single_figures(load: LoadResult, clients: int) -> dict[str, Any]:
    accepted = load.statuses.get(201, 0)
    return {
        "accepted": accepted,
        "errors": {s: n for s, n in load.statuses.items() if s != 201},
        "seconds": round(load.seconds, 3),
        "accepted_per_second": round(accepted / load.seconds, 1),
        "clients": clients,
        "p50_ms": _pct(load.times, 0.5),
        "p99_ms": _pct(load.times, 0.99),
    }


async def batches(port: int, count: int) -> LoadResult:
    # Bodies are built before the clock starts: the client's JSON encoding is not the API's cost.
    requests = batch_requests(count)
    bar = Progress(
        f"POST /notifications/batch x{count} (1,000 each), {BATCH_CLIENTS} clients", count
    )
    done = 0

    def tick(status: int) -> None:
        nonlocal done
        done += 1
        bar.update(done)

    load = await run_load(
        "127.0.0.1", port, requests, clients=BATCH_CLIENTS, keep_bodies=True, on_response=tick
    )
    bar.close()
    return load


def batch_figures(load: LoadResult) -> dict[str, Any]:
    accepted = sum(
        sum(1 for x in json.loads(body)["results"] if x["status"] == 201) for body in load.bodies
    )
    return {
        "batch_accepted": accepted,
        "batch_errors": {s: n for s, n in load.statuses.items() if s != 200},
        "batch_seconds": round(load.seconds, 3),
        "batch_accepted_per_second": round(accepted / load.seconds, 1),
        "batch_clients": BATCH_CLIENTS,
        "batch_p50_ms": _pct(load.times, 0.5),
        "batch_p99_ms": _pct(load.times, 0.99),
    }


def start_api(ctx: Context, url: str, api_workers: int) -> tuple[Proc, int]:
    port = _free_port()
    proc = notify_queue(
        "api",
        [
            "--database-url",
            url,
            "--port",
            str(port),
            "--log-level",
            "WARNING",
            "--api-workers",
            str(api_workers),
        ],
        ctx.logdir,
        f"api-{api_workers}-{time.time_ns()}",
    )
    try:
        asyncio.run(_wait_ready(f"http://127.0.0.1:{port}"))
    except Exception:
        proc.stop()
        raise RuntimeError(f"API did not start:\n{proc.log_tail()}") from None
    return proc, port


def _reset_statements(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def _statements(url: str) -> tuple[list[dict[str, Any]], int]:
    """The top statements, and how many statements ran in all (pg_stat_statements itself and
    this harness's own reads excluded)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND query NOT ILIKE '%pg_stat_statements%'"
        ).fetchone()
        return top_statements(conn, 4), int(row[0]) if row else 0


def run(ctx: Context) -> None:
    s = ctx.sizes
    for api_workers in [1, 2] if ctx.mode != "smoke" else [1]:
        name = ctx.pg.database("ingest")
        url = ctx.pg.url(name)
        try:
            queue.migrate(url)
            proc, port = start_api(ctx, url, api_workers)
            try:
                say(f"[ingest] API with {api_workers} process(es)")
                _reset_statements(url)
                load_watch = LoadWatch()
                cpu = _CpuWatch(ctx, proc)
                load = asyncio.run(single(port, s.ingest_single))
                figures = single_figures(load, SINGLE_CLIENTS)
                figures |= cpu.finish(load, figures["accepted"])
                figures["top_statements"], calls = _statements(url)
                figures["statements_per_request"] = round(calls / len(load.times), 2)
                figures["creates_per_statement"] = (
                    round(len(load.times) / calls, 1) if calls else None
                )
                ctx.record(
                    "ingest",
                    f"POST /notifications, api-workers={api_workers}",
                    figures,
                    load=load_watch,
                    params={
                        "clients": SINGLE_CLIENTS,
                        "api_workers": api_workers,
                        "requests": s.ingest_single,
                        "client": "benchmarks.httpload (raw asyncio, keep-alive)",
                    },
                )
                _reset_statements(url)
                load_watch = LoadWatch()
                cpu = _CpuWatch(ctx, proc)
                load = asyncio.run(batches(port, s.ingest_batches))
                figures = batch_figures(load)
                figures |= cpu.finish(load, figures["batch_accepted"])
                figures["top_statements"], calls = _statements(url)
                figures["statements_per_request"] = round(calls / len(load.times), 2)
                ctx.record(
                    "ingest",
                    f"POST /notifications/batch, api-workers={api_workers}",
                    figures,
                    load=load_watch,
                    params={
                        "clients": BATCH_CLIENTS,
                        "api_workers": api_workers,
                        "batches": s.ingest_batches,
                        "batch_size": BATCH_SIZE,
                        "client": "benchmarks.httpload (raw asyncio, keep-alive)",
                    },
                )
            finally:
                proc.stop()
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute("SELECT count(*) FROM nq_all_notifications").fetchone()
            ctx.notes.append(
                f"ingest api-workers={api_workers}: {row[0] if row else '?'} rows stored"
            )
        finally:
            ctx.pg.drop(name)
