"""2. Ingest through the HTTP API (`notify-queue api`, no workers running): `POST /notifications`
one at a time from several concurrent aiohttp clients, and `POST /notifications/batch` with 1,000
notifications per call; accepted (201) per second, and each request's time.

The API runs with `--api-workers 2` (one uvicorn process per core) and also, for the single
requests, with 1, so the figure per process is visible.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from typing import Any

import aiohttp
import psycopg

from benchmarks import queue
from benchmarks.burn import top_statements
from benchmarks.context import Context
from benchmarks.env import LoadWatch
from benchmarks.procs import notify_queue
from benchmarks.progress import Progress, say

SINGLE_CLIENTS = 32
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


async def single(base: str, total: int) -> dict[str, Any]:
    accepted = 0
    errors: dict[int, int] = {}
    times: list[float] = []
    counter = iter(range(total))
    bar = Progress(f"POST /notifications x{total:,}, {SINGLE_CLIENTS} clients", total)
    headers = {"Content-Type": "application/json"}

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal accepted
        for _ in counter:
            key = uuid.uuid4().hex
            t0 = time.perf_counter()
            async with session.post(
                f"{base}/notifications",
                data=json.dumps(_item(key)),
                headers=headers | {"Idempotency-Key": key},
            ) as r:
                await r.read()
                times.append(time.perf_counter() - t0)
                if r.status == 201:
                    accepted += 1
                else:
                    errors[r.status] = errors.get(r.status, 0) + 1
            bar.update(accepted)

    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=SINGLE_CLIENTS)
    ) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(SINGLE_CLIENTS)))
        elapsed = time.perf_counter() - t0
    bar.close()
    return {
        "accepted": accepted,
        "errors": errors,
        "seconds": round(elapsed, 3),
        "accepted_per_second": round(accepted / elapsed, 1),
        "clients": SINGLE_CLIENTS,
        "p50_ms": _pct(times, 0.5),
        "p99_ms": _pct(times, 0.99),
    }


async def batches(base: str, count: int) -> dict[str, Any]:
    accepted = 0
    errors: dict[int, int] = {}
    times: list[float] = []
    counter = iter(range(count))
    bar = Progress(
        f"POST /notifications/batch x{count} (1,000 each), {BATCH_CLIENTS} clients",
        count * BATCH_SIZE,
    )
    # Bodies are built before the clock starts: the client's JSON encoding is not the API's cost.
    bodies = [
        json.dumps(
            {
                "notifications": [
                    _item(k) | {"idempotencyKey": k}
                    for k in (uuid.uuid4().hex for _ in range(BATCH_SIZE))
                ]
            }
        )
        for _ in range(count)
    ]

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal accepted
        for i in counter:
            t0 = time.perf_counter()
            async with session.post(
                f"{base}/notifications/batch",
                data=bodies[i],
                headers={"Content-Type": "application/json"},
            ) as r:
                body = await r.read()
                times.append(time.perf_counter() - t0)
                if r.status == 200:
                    accepted += sum(1 for x in json.loads(body)["results"] if x["status"] == 201)
                else:
                    errors[r.status] = errors.get(r.status, 0) + 1
            bar.update(accepted)

    async with aiohttp.ClientSession() as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(BATCH_CLIENTS)))
        elapsed = time.perf_counter() - t0
    bar.close()
    return {
        "batch_accepted": accepted,
        "batch_errors": errors,
        "batch_seconds": round(elapsed, 3),
        "batch_accepted_per_second": round(accepted / elapsed, 1),
        "batch_clients": BATCH_CLIENTS,
        "batch_p50_ms": _pct(times, 0.5),
        "batch_p99_ms": _pct(times, 0.99),
    }


def _api(ctx: Context, url: str, api_workers: int) -> tuple[Any, str]:
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
    base = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(_wait_ready(base))
    except Exception:
        proc.stop()
        raise RuntimeError(f"API did not start:\n{proc.log_tail()}") from None
    return proc, base


def _reset_statements(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def _statements(url: str) -> list[dict[str, Any]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return top_statements(conn, 4)


def run(ctx: Context) -> None:
    s = ctx.sizes
    for api_workers in [1, 2] if ctx.mode != "smoke" else [1]:
        name = ctx.pg.database("ingest")
        url = ctx.pg.url(name)
        try:
            queue.migrate(url)
            proc, base = _api(ctx, url, api_workers)
            try:
                say(f"[ingest] API with {api_workers} process(es)")
                _reset_statements(url)
                load = LoadWatch()
                figures = asyncio.run(single(base, s.ingest_single))
                figures["top_statements"] = _statements(url)
                ctx.record(
                    "ingest",
                    f"POST /notifications, api-workers={api_workers}",
                    figures,
                    load=load,
                    params={
                        "clients": SINGLE_CLIENTS,
                        "api_workers": api_workers,
                        "requests": s.ingest_single,
                    },
                )
                _reset_statements(url)
                load = LoadWatch()
                figures = asyncio.run(batches(base, s.ingest_batches))
                figures["top_statements"] = _statements(url)
                ctx.record(
                    "ingest",
                    f"POST /notifications/batch, api-workers={api_workers}",
                    figures,
                    load=load,
                    params={
                        "clients": BATCH_CLIENTS,
                        "api_workers": api_workers,
                        "batches": s.ingest_batches,
                        "batch_size": BATCH_SIZE,
                    },
                )
            finally:
                proc.stop()
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute("SELECT count(*) FROM nq_notifications").fetchone()
            ctx.notes.append(
                f"ingest api-workers={api_workers}: {row[0] if row else '?'} rows stored"
            )
        finally:
            ctx.pg.drop(name)
