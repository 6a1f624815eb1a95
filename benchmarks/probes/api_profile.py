"""Profile the API's create path: where one `POST /notifications` (and one batch item) goes.

    python -m benchmarks.probes.api_profile [--single N] [--batches B] [--api-workers W]

A fresh embedded PostgreSQL, `notify-queue migrate`, one `notify-queue api` process, then the
ingest scenario's load (`benchmarks.httpload`: 64 keep-alive clients sending single creates, then
2 clients sending batches of 1,000) while py-spy samples the API process. Prints, per phase, the
share of the API's CPU by layer (JSON, pydantic, row decoding and the driver, the framework, the
server, the event loop, our own code), the hottest functions, the statements that took the most
server time (pg_stat_statements) and the CPU split per notification. Needs `pip install py-spy`.

A frame's layer is that of the innermost frame of the stack that belongs to a known library, so
C code called from a library (json's scanner, psycopg's loaders) counts for that library, and our
own code is what is left when no library frame is on top of it.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg

from benchmarks import queue
from benchmarks.burn import top_statements
from benchmarks.context import QUICK, Context
from benchmarks.env import BenchPostgres
from benchmarks.procs import Receiver
from benchmarks.scenarios import ingest

# (layer, top-level modules of a frame's file), first match from the innermost frame wins.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("JSON (parse and serialise)", ("json", "orjson", "notify_queue/jsontext.py")),
    ("pydantic", ("pydantic", "pydantic_core")),
    ("psycopg (driver, row decoding)", ("psycopg", "psycopg_pool", "psycopg_binary")),
    ("FastAPI / Starlette (routing, middleware, Request/Response)", ("fastapi", "starlette")),
    ("uvicorn + httptools (HTTP server)", ("uvicorn", "httptools")),
    ("asyncio / uvloop (event loop, tasks, futures)", ("asyncio", "uvloop")),
    ("hashlib, uuid, datetime, re, enum", ("hashlib.py", "uuid.py", "re", "enum.py")),
    ("notify_queue: validation", ("services/validation.py", "api/body.py")),
    ("notify_queue: repository, rows", ("notify_queue/repositories/",)),
    ("notify_queue: answer JSON", ("api/schemas.py",)),
    ("notify_queue: routes, service, coalescing", ("notify_queue",)),
]
_FILE = re.compile(r"\(([^():]+)(?::\d+)?\)$")


def layer_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        found = _FILE.search(frame)
        path = found.group(1) if found else ""
        top = path.split("/", 1)[0]
        for name, modules in LAYERS:
            if top in modules or any("/" in m and m in path for m in modules):
                return name
    return "other"


def summarise(raw: Path, top: int = 20) -> tuple[dict[str, float], str]:
    layers: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        samples += n
        frames = stack.split(";")
        layers[layer_of(frames)] += n
        own[frames[-1]] += n
    shares = {k: round(v / samples, 3) for k, v in layers.most_common()} if samples else {}
    out = [f"{samples} samples", "-- layers --"]
    out += [f"{v:6.1%}  {k}" for k, v in shares.items()]
    out += ["-- own time --"]
    out += [f"{c / samples:6.1%}  {f}" for f, c in own.most_common(top)]
    return shares, "\n".join(out)


def _spy(pid: int, raw: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            str(Path(sys.executable).parent / "py-spy"),
            "record",
            "--pid",
            str(pid),
            "--format",
            "raw",
            "--output",
            str(raw),
            "--rate",
            "200",
            "--nonblocking",
            "--subprocesses",
            "--gil",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _stop(spy: subprocess.Popen[bytes]) -> None:
    spy.send_signal(signal.SIGINT)
    spy.wait(60)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--single", type=int, default=10_000)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--api-workers", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("/tmp/nq-api-profile"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="nq-api-prof-"))
    pg = BenchPostgres(workdir)
    receiver = Receiver(workdir)
    ctx = Context("profile", QUICK, pg, workdir, receiver, [])
    try:
        name = pg.database("apiprof")
        url = pg.url(name)
        queue.migrate(url)
        proc, port = ingest.start_api(ctx, url, args.api_workers)
        try:
            for phase in ("single", "batch"):
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("SELECT pg_stat_statements_reset()")
                cpu = ingest._CpuWatch(ctx, proc)
                raw = args.out / f"api-{phase}.txt"
                spy = _spy(proc.pid, raw)
                figures: dict[str, Any]
                if phase == "single":
                    load = asyncio.run(ingest.single(port, args.single))
                    figures = ingest.single_figures(load, ingest.SINGLE_CLIENTS)
                    figures |= cpu.finish(load, figures["accepted"])
                else:
                    load = asyncio.run(ingest.batches(port, args.batches))
                    figures = ingest.batch_figures(load)
                    figures |= cpu.finish(load, figures["batch_accepted"])
                _stop(spy)
                with psycopg.connect(url, autocommit=True) as conn:
                    statements = top_statements(conn, 6)
                print(f"== {phase} ==")
                print({k: v for k, v in figures.items() if k != "top_statements"})
                for s in statements:
                    print(
                        f"  {s['total_ms']:>9.1f} ms {s['calls']:>6} calls "
                        f"{s['mean_ms']:.3f} ms/call  {s['query']}"
                    )
                if raw.exists():
                    print(summarise(raw)[1])
        finally:
            proc.stop()
    finally:
        receiver.stop()
        pg.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
