"""What tracing costs a worker: CPU per delivery without the instrumentation, with it off, and on.

Three workers, each run alone against the same fresh embedded PostgreSQL, deliver the same burst
(the simulated provider, no latency, no webhooks) and their own CPU time (user + system, from
/proc) is read from just before the burst is enqueued until the last of it is final:

- `baseline`: the code before tracing existed (the parent of the commit that added
  `notify_queue/tracing.py`, or `--baseline-ref`), run from an exported copy of its `src/` with
  this virtualenv, so only the code differs;
- `off`: this code, no `OTEL_*` exporter (the default installation);
- `on`: this code, exporting OTLP/HTTP to a sink in this process (which answers 200 and counts).

The variants run in turns (`--rounds` of each, interleaved, so the machine's other load falls on
all of them alike) and the median of each is compared. CPU time, not wall time: on a shared
machine the wall clock measures the neighbours.

    .venv/bin/python -m benchmarks.probes.tracing [--burst 5000] [--rounds 3]

Writes `<timestamp>.json` and `latest.json` to `--output-dir` (`benchmarks/results/tracing`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from aiohttp import web

from benchmarks.enqueue import new_notification
from benchmarks.procs import REPO, Proc
from notify_queue.embedded import EmbeddedPostgres
from notify_queue.repositories.db import Database
from notify_queue.repositories.notifications import NotificationRepository
from notify_queue.services.notifications import NotificationService
from notify_queue.services.wakeups import DebouncedWaker

OUT = Path(__file__).resolve().parent.parent / "results" / "tracing"
_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (/proc/<pid>/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _baseline_ref() -> str:
    added = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "-1", "--", "src/notify_queue/tracing.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not added:
        raise SystemExit("no commit adds src/notify_queue/tracing.py: pass --baseline-ref")
    return f"{added}^"


def _export_src(ref: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "archive", "--format=tar", ref, "src"], cwd=REPO, capture_output=True, check=True
    ).stdout
    tar_path = into / "baseline.tar"
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


class Sink:
    """An OTLP/HTTP endpoint that accepts and counts exports, on a thread of its own."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        self.url = ""
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait(30)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)

        async def export(request: web.Request) -> web.Response:
            self.requests += 1
            self.bytes += len(await request.read())
            return web.Response(content_type="application/x-protobuf")

        async def start() -> None:
            app = web.Application()
            app.router.add_post("/v1/traces", export)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.url = f"http://127.0.0.1:{port}"

        self._loop.run_until_complete(start())
        ready.set()
        self._loop.run_forever()


async def _enqueue(url: str, burst: int, prefix: str) -> None:
    async with Database(url, pool_size=2, name="bench-tracing") as db:
        repo = NotificationRepository(db)
        waker = DebouncedWaker(repo.workers_wake)
        service = NotificationService(repo, default_max_attempts=6, waker=waker)
        for start in range(0, burst, 1000):
            await service.enqueue_many(
                [new_notification(f"{prefix}-{i}") for i in range(start, min(burst, start + 1000))]
            )
        await waker.close()


def _unfinished(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM nq_jobs").fetchone()
        assert row is not None
        return int(row[0])


def _one_run(
    variant: str, url: str, burst: int, work: Path, env: dict[str, str], round_: int
) -> dict[str, Any]:
    argv = [sys.executable, "-m", "notify_queue", "worker", "--database-url", url]
    argv += ["--log-level", "WARNING", "--rate-limit", str(burst * 10)]
    worker = Proc(f"{variant}-{round_}", argv, work, env=env)
    try:
        time.sleep(3.0)  # started, listening, its first (empty) claim done
        if not worker.alive():
            raise SystemExit(f"{variant} worker died:\n{worker.log_tail()}")
        before = _cpu_seconds(worker.pid)
        started = time.monotonic()
        asyncio.run(_enqueue(url, burst, f"{variant}-{round_}"))
        while _unfinished(url):
            if not worker.alive():
                raise SystemExit(f"{variant} worker died:\n{worker.log_tail()}")
            time.sleep(0.1)
        time.sleep(0.5)  # the last spans' export (on), the last completion's bookkeeping
        cpu = _cpu_seconds(worker.pid) - before
        wall = time.monotonic() - started
    finally:
        worker.stop()
    return {"cpuSeconds": round(cpu, 3), "wallSeconds": round(wall, 2)}


def _off_hooks(repeat: int = 200_000) -> dict[str, float]:
    """The code tracing adds to one delivery and its webhook event when off, timed alone: the
    checks in the worker's delivery, the router's call, the completer, the HTTP provider's
    headers, and the relay's span and headers; the claim's and the completion statement's spans
    too, counted as if every batch held one notification (the worst case)."""
    from notify_queue import tracing

    assert not tracing.enabled()

    def one_delivery() -> None:
        tracing.enabled()  # runner._deliver
        tracing.enabled()  # Router._visit
        with tracing.span("notify_queue.claim", root=True):
            pass
        with tracing.span("notify_queue.complete", root=True):
            pass
        tracing.aiohttp_headers()  # HttpProvider.deliver
        tracing.enabled()  # the relay's claim
        with tracing.span("notify_queue.webhook.relay", parent=None, root=True) as span:
            tracing.propagation_headers(tracing.traceparent_of(span))

    started = time.process_time()  # CPU time: the wall clock would measure the neighbours
    for _ in range(repeat):
        one_delivery()
    seconds = (time.process_time() - started) / repeat
    return {"microsecondsPerDelivery": round(seconds * 1e6, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burst", type=int, default=5000, help="notifications per run")
    parser.add_argument("--rounds", type=int, default=5, help="runs of each variant")
    parser.add_argument("--baseline-ref", default=None)
    parser.add_argument("--output-dir", type=Path, default=OUT)
    args = parser.parse_args(argv)
    ref = args.baseline_ref or _baseline_ref()
    started = datetime.now(UTC)
    root = Path(tempfile.mkdtemp(prefix="nq-bench-tracing-"))
    server = EmbeddedPostgres(root / "pg", delete_on_stop=True)
    sink = Sink()
    try:
        baseline_src = _export_src(ref, root)
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET fsync = off")
            conn.execute("ALTER SYSTEM SET synchronous_commit = off")
            conn.execute("SELECT pg_reload_conf()")
            conn.execute("CREATE DATABASE tracing")
        url = server.url("tracing")
        migrate = Proc(
            "migrate",
            [sys.executable, "-m", "notify_queue", "migrate", "--database-url", url],
            root,
        )
        if migrate.popen.wait(180) != 0:
            raise SystemExit(f"migrate failed:\n{migrate.log_tail()}")
        migrate.stop()
        clean = {
            k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NOTIFY_QUEUE_"))
        }
        variants = {
            "baseline": {**clean, "PYTHONPATH": str(baseline_src)},
            "off": clean,
            "on": {**clean, "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url},
            "on-no-statement-spans": {
                **clean,
                "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url,
                "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "psycopg",
            },
            "on-sampled-10%": {
                **clean,
                "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url,
                "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": "0.1",
            },
        }
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        for round_ in range(args.rounds):
            for variant, env in variants.items():
                run = _one_run(variant, url, args.burst, root, env, round_)
                runs[variant].append(run)
                print(
                    f"round {round_ + 1} {variant:8s} cpu {run['cpuSeconds']:.2f}s "
                    f"wall {run['wallSeconds']:.1f}s",
                    flush=True,
                )
        median = {v: statistics.median(r["cpuSeconds"] for r in rs) for v, rs in runs.items()}
        # The least disturbed run of each: on a shared machine, other load only ever adds.
        least = {v: min(r["cpuSeconds"] for r in rs) for v, rs in runs.items()}
        per_delivery_us = {v: round(s / args.burst * 1e6, 1) for v, s in median.items()}
        doc = {
            "benchmark": "tracing",
            "started": started.isoformat(timespec="seconds"),
            "burst": args.burst,
            "rounds": args.rounds,
            "baselineRef": subprocess.run(
                ["git", "rev-parse", ref], cwd=REPO, capture_output=True, text=True
            ).stdout.strip(),
            "cpus": os.cpu_count(),
            "loadAverage": os.getloadavg(),
            "runs": runs,
            "medianCpuSeconds": median,
            "cpuMicrosecondsPerDelivery": per_delivery_us,
            "vsBaselinePercent": {
                v: round((s / median["baseline"] - 1) * 100, 1) for v, s in median.items()
            },
            "minCpuSeconds": least,
            "minVsBaselinePercent": {
                v: round((s / least["baseline"] - 1) * 100, 1) for v, s in least.items()
            },
            "offHooks": _off_hooks(),
            "sink": {"exports": sink.requests, "bytes": sink.bytes},
        }
        print(
            json.dumps(
                {
                    k: doc[k]
                    for k in (
                        "cpuMicrosecondsPerDelivery",
                        "vsBaselinePercent",
                        "minVsBaselinePercent",
                        "offHooks",
                    )
                }
            )
        )
        args.output_dir.mkdir(parents=True, exist_ok=True)
        text = json.dumps(doc, indent=1)
        (args.output_dir / f"{started:%Y%m%dT%H%M%SZ}.json").write_text(text)
        (args.output_dir / "latest.json").write_text(text)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
