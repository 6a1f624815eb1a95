"""The API's own CPU per batch item (or single create), checkouts alternating (issue 20's API path;
docs/performance.md, "A batch checked a step at a time").

    python -m benchmarks.probes.apicpu [--items N] [--batch B] [--clients C] [--single] [--rounds R]
                                [--api-workers W] [--src SRC,...]

A fresh embedded PostgreSQL, and per run a fresh database: `notify-queue migrate`, one real
`notify-queue api` process (one worker process, or W with `--api-workers`, whose CPU is counted
together; its start-up not counted), a warm-up of 2,000
items, then N items in batches of B (or, with `--single`, N single creates, each with its key in
the header) from C keep-alive clients (`benchmarks.httpload`); the API process's CPU (user +
system, from /proc) and PostgreSQL's (the server and its backends) over the N items, and the
items per second the clients saw. `--src` runs each listed checkout's code
in turn (`<checkout>/src` as the API's PYTHONPATH; `.` is this one), alternating within each
round, so two versions meet the same host: on this machine the host moves one version's figure
by ±10% between rounds, so only pairs and their medians compare. Prints one line per run and
the medians; writes `benchmarks/results/apicpu/<timestamp>.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from benchmarks import alternating, queue
from benchmarks.burn import cpu_seconds
from benchmarks.env import BenchPostgres, fresh_postgres
from benchmarks.httpload import run_load
from benchmarks.scenarios.cost import _batches
from benchmarks.scenarios.ingest import _free_port, _tree, _wait_ready, single_requests

RESULTS = Path(__file__).parent.parent / "results" / "apicpu"
WARM_ITEMS = 2_000


def one_run(
    pg: BenchPostgres,
    src: str,
    items: int,
    size: int,
    clients: int,
    *,
    single: bool = False,
    api_workers: int = 1,
) -> dict[str, Any]:
    name = pg.database("apicpu")
    url = pg.url(name)
    queue.migrate(url)
    env = alternating.checkout_environment(src)
    port = _free_port()
    command = [sys.executable, "-m", "notify_queue", "api", "--database-url", url]
    api = subprocess.Popen(
        [
            *command,
            "--port",
            str(port),
            "--log-level",
            "WARNING",
            "--api-workers",
            str(api_workers),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        asyncio.run(_wait_ready(f"http://127.0.0.1:{port}"))

        def load(n: int, tag: str) -> list[bytes]:
            return single_requests(n) if single else _batches(n, tag, size)

        asyncio.run(run_load("127.0.0.1", port, load(WARM_ITEMS, "apicpu-warm"), clients=clients))
        requests = load(items, "apicpu")
        api_pids = _tree(api.pid)  # with --api-workers, uvicorn's worker processes too
        before = cpu_seconds(api_pids)
        postgres_before = _postgres_cpu(pg)
        result = asyncio.run(run_load("127.0.0.1", port, requests, clients=clients))
        cpu = cpu_seconds(api_pids) - before
        postgres = _postgres_cpu(pg)
        if set(result.statuses) != {201 if single else 200}:
            raise RuntimeError(f"{src}: unexpected answers: {result.statuses}")
    finally:
        api.terminate()
        api.wait()
        pg.drop(name)
    # The server and the backends alive at the end (the API's pool: its connections outlive the
    # load); a backend that came and went during the load is missed, so this is a floor.
    postgres_cpu = sum(t - postgres_before.get(pid, 0.0) for pid, t in postgres.items())
    return {
        "api_cpu_us_per_item": round(cpu / items * 1e6, 1),
        "postgres_cpu_us_per_item": round(postgres_cpu / items * 1e6, 1),
        "items_per_second": round(items / result.seconds, 1),
    }


def _postgres_cpu(pg: BenchPostgres) -> dict[int, float]:
    """CPU seconds (user + system) of the postmaster and each of its children, by pid."""
    pid = pg.server.pid
    assert pid is not None
    server = psutil.Process(pid)
    return {p.pid: cpu_seconds([p.pid]) for p in [server, *server.children()]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument(
        "--single", action="store_true", help="single POST /notifications instead of batches"
    )
    ap.add_argument("--api-workers", type=int, default=1, help="the API's --api-workers")
    alternating.add_arguments(ap, RESULTS)
    args = ap.parse_args()
    sources = args.src.split(",")
    with fresh_postgres("apicpu") as pg:
        runs = alternating.alternate(
            args.rounds,
            sources,
            lambda src: one_run(
                pg,
                src,
                args.items,
                args.batch,
                args.clients,
                single=args.single,
                api_workers=args.api_workers,
            ),
            lambda run: (
                f"API {run['api_cpu_us_per_item']} us per item,"
                f" PostgreSQL {run['postgres_cpu_us_per_item']} us,"
                f" {run['items_per_second']} items/s"
            ),
        )
    medians = alternating.medians(
        runs, sources, ("api_cpu_us_per_item", "postgres_cpu_us_per_item", "items_per_second")
    )
    params = {k: v for k, v in vars(args).items() if k != "output_dir"}
    alternating.write(args.output_dir, {"params": params, "runs": runs, "medians": medians})


if __name__ == "__main__":
    main()
