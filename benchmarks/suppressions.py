"""The suppression list's cost on the create and send paths (docs/receipts.md), A/B in one run.

    python -m benchmarks.suppressions [--notifications N] [--suppressed S]

One fresh embedded PostgreSQL, two fresh databases measured one after the other: `empty` (no
address on the suppression list) and `listed` (S addresses on it, none of them a recipient of the
run, so both variants send everything and the difference is the checks' cost alone). In each:
`notify-queue migrate`, one `notify-queue api` process taking N creates as batches of 500, then
two `notify-queue worker` processes (simulated provider, no webhooks) until every notification is
SENT. The PostgreSQL CPU of the ingest and of the drain per notification is counted as the cost
benchmark counts it (benchmarks/dbcost.py); figures go to
`benchmarks/results/suppressions/<timestamp>.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from benchmarks import alternating, dbcost, queue
from benchmarks.env import BenchPostgres, fresh_postgres
from benchmarks.httpload import request_bytes, run_load
from benchmarks.scenarios.ingest import _free_port, _item, _wait_ready

RESULTS = Path(__file__).parent / "results" / "suppressions"
BATCH = 500
WORKERS = 2

_LIST = """
INSERT INTO nq_suppressions (channel, address, reason, at)
SELECT 'email', 'gone-' || i || '@example.com', 'bounced', now()
FROM generate_series(1, %(n)s) AS i
"""


def _batches(n: int) -> list[bytes]:
    out = []
    for first in range(0, n, BATCH):
        items = []
        for _ in range(first, min(first + BATCH, n)):
            key = uuid.uuid4().hex
            items.append(_item(key) | {"idempotencyKey": key})
        body = json.dumps({"notifications": items}).encode()
        out.append(request_bytes("POST", "/notifications/batch", body))
    return out


def _start(role: str, url: str, where: Path, extra: list[str]) -> subprocess.Popen[bytes]:
    log = (where / f"{role}-{time.time_ns()}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "notify_queue", role, "--database-url", url, *extra],
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(60)


def one_run(pg: BenchPostgres, variant: str, n: int, suppressed: int) -> dict[str, Any]:
    name = pg.database(f"suppressions_{variant}")
    url = pg.url(name)
    dbcost.prepare_database(pg.url(), name)
    queue.migrate(url)
    if suppressed:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(_LIST, {"n": suppressed})
            conn.execute("ANALYZE nq_suppressions")
    requests = _batches(n)
    assert pg.server.pid is not None
    observer = dbcost.Observer(url, pg.server.pid)
    try:
        port = _free_port()
        api = _start("api", url, pg.workdir, ["--port", str(port), "--log-level", "WARNING"])
        try:
            asyncio.run(_wait_ready(f"http://127.0.0.1:{port}", timeout=120))
            s0 = observer.snapshot()
            result = asyncio.run(run_load("127.0.0.1", port, requests, clients=2))
        finally:
            _stop([api])
        observer.wait_for_backends_gone()
        s1 = observer.snapshot()
        workers = [
            _start("worker", url, pg.workdir, ["--log-level", "WARNING"]) for _ in range(WORKERS)
        ]
        try:
            deadline = time.monotonic() + max(300.0, n / 50)
            while queue.any_unfinished(observer.conn):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{variant}: not drained in time")
                time.sleep(0.25)
        finally:
            _stop(workers)
        observer.wait_for_backends_gone()
        s2 = observer.snapshot()
        row = observer.conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'SENT') FROM nq_all_notifications"
        ).fetchone()
        sent = int(row[0]) if row else 0
        ingest = dbcost.per_unit(observer.diff("ingest", s0, s1), n)
        drain = dbcost.per_unit(observer.diff("drain", s1, s2), n)
    finally:
        observer.close()
    return {
        "variant": variant,
        "notifications": n,
        "suppressed_addresses": suppressed,
        "statuses": result.statuses,
        "sent": sent,
        "ingest": ingest,
        "drain": drain,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notifications", type=int, default=20_000)
    parser.add_argument("--suppressed", type=int, default=100_000)
    args = parser.parse_args()
    runs = []
    with fresh_postgres("suppressions") as pg:
        dbcost.prepare_server(pg.url())
        for variant, listed in (("empty", 0), ("listed", args.suppressed)):
            run = one_run(pg, variant, args.notifications, listed)
            print(
                f"{variant:7} {listed:>8,} on the list: {run['sent']:,} sent; PostgreSQL per "
                f"notification: ingest {run['ingest']['postgres_cpu_us']} us CPU "
                f"({run['ingest']['statements']} statements), drain "
                f"{run['drain']['postgres_cpu_us']} us CPU ({run['drain']['statements']} "
                "statements)"
            )
            runs.append(run)
    alternating.write(RESULTS, {"runs": runs})


if __name__ == "__main__":
    main()
