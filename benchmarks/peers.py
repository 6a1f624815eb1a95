"""The peer queues on the same PostgreSQL: pg-boss (Node), Procrastinate (Python) and River (Go),
each in its own database, each burning down the same number of due no-op jobs; pg-boss and
Procrastinate with the same number of worker processes as Notify Queue, River with the one client
of 2,000 workers that `river bench` uses. Installed by peers/setup.sh into benchmark-only
locations.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.context import Context
from benchmarks.env import LoadWatch
from benchmarks.procs import Proc, stop_all
from benchmarks.progress import Progress, say

PEERS = Path(__file__).resolve().parent / "peers"
NODE = PEERS / "node" / "node_modules" / ".bin" / "node"
PGBOSS_SCRIPT = PEERS / "node" / "pgboss_burn.mjs"
PROCRASTINATE_PY = PEERS / ".venv-procrastinate" / "bin" / "python"
PROCRASTINATE_SCRIPT = PEERS / "procrastinate_burn.py"
RIVER_SOURCES = [PEERS / "river" / name for name in ("main.go", "go.mod", "go.sum")]
RIVER = PEERS / "river" / ".build" / "riverburn"


def river_built() -> bool:
    """The River binary exists and is newer than its sources."""
    return RIVER.exists() and RIVER.stat().st_mtime >= max(p.stat().st_mtime for p in RIVER_SOURCES)


def ensure_installed() -> None:
    if (
        NODE.exists()
        and (PEERS / "node" / "node_modules" / "pg-boss").exists()
        and PROCRASTINATE_PY.exists()
        and (river_built() or shutil.which("go") is None)
    ):
        return
    subprocess.run(["bash", str(PEERS / "setup.sh")], check=True)


def versions() -> dict[str, str | None]:
    def read(cmd: list[str]) -> str | None:
        try:
            return subprocess.run(
                cmd, capture_output=True, text=True, timeout=30, check=True
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    river: dict[str, str] = {}
    if RIVER.exists():
        river = json.loads(read([str(RIVER), "version"]) or "{}")
    return {
        "node": read([str(NODE), "--version"]),
        "pg-boss": read(
            [
                str(NODE),
                "-p",
                "require('"
                + str(PEERS / "node" / "node_modules" / "pg-boss" / "package.json")
                + "').version",
            ]
        )
        if NODE.exists()
        else None,
        "procrastinate": read(
            [
                str(PROCRASTINATE_PY),
                "-c",
                "import importlib.metadata as m; print(m.version('procrastinate'))",
            ]
        ),
        "river": river.get("river"),
        "go": river.get("go"),
    }


def _watch(
    label: str,
    url: str,
    total: int,
    remaining_sql: str,
    procs: list[Proc],
    timeout: float,
    *,
    exits_when_done: bool = False,
) -> bool:
    """Until nothing is left (True) or the timeout (False); a process that dies fails the run,
    except, with `exits_when_done`, one that exited 0 (it has seen every job done; the next
    count sees it too)."""
    bar = Progress(label, total)
    deadline = time.monotonic() + timeout
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            while True:
                row = conn.execute(remaining_sql).fetchone()
                left = int(row[0]) if row else 0
                bar.update(total - left)
                if left == 0:
                    return True
                dead = [
                    p
                    for p in procs
                    if not p.alive() and not (exits_when_done and p.popen.returncode == 0)
                ]
                if dead:
                    raise RuntimeError(f"{dead[0].name} exited:\n{dead[0].log_tail()}")
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.25)
    finally:
        bar.close()


def _rate(count: int, start: Any, end: Any) -> dict[str, Any]:
    if start is None or end is None:
        return {"completed": count}
    seconds = (end - start).total_seconds()
    return {
        "completed": count,
        "seconds": round(seconds, 3),
        "jobs_per_second": round(count / seconds, 1) if seconds > 0 else None,
    }


def pgboss_burn(
    ctx: Context, *, jobs: int, workers: int, batch_size: int, local_concurrency: int = 1
) -> dict[str, Any]:
    name = ctx.pg.database("pgboss")
    url = ctx.pg.url(name)
    try:
        _seed(
            "pg-boss",
            [str(NODE), str(PGBOSS_SCRIPT), "seed", ctx.pg.socket_dir, name, str(jobs)],
            url,
            cwd=PEERS,
        )
        load = LoadWatch()
        procs = [
            Proc(
                f"pgboss-{i}-{time.time_ns()}",
                [
                    str(NODE),
                    str(PGBOSS_SCRIPT),
                    "work",
                    ctx.pg.socket_dir,
                    name,
                    str(batch_size),
                    str(local_concurrency),
                ],
                ctx.logdir,
                cwd=PEERS,
            )
            for i in range(workers)
        ]
        try:
            finished = _watch(
                f"pg-boss W={workers} batchSize={batch_size}",
                url,
                jobs,
                "SELECT count(*) FROM pgboss.job WHERE name = 'bench' AND state <> 'completed'",
                procs,
                max(120.0, jobs / 200),
            )
        finally:
            stop_all(procs)
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE state = 'completed'), min(started_on),"
                " max(completed_on) "
                "FROM pgboss.job WHERE name = 'bench'"
            ).fetchone()
        assert row is not None
        out = _rate(row[0], row[1], row[2]) | {"timed_out": not finished, "load": load.finish()}
        return out
    finally:
        ctx.pg.drop(name)


def procrastinate_burn(
    ctx: Context, *, jobs: int, workers: int, concurrency: int
) -> dict[str, Any]:
    name = ctx.pg.database("procrastinate")
    url = ctx.pg.url(name)
    try:
        seed = subprocess.run(
            [str(PROCRASTINATE_PY), str(PROCRASTINATE_SCRIPT), "seed", url, str(jobs)],
            capture_output=True,
            text=True,
            cwd=PEERS,
            timeout=600,
        )
        if seed.returncode != 0:
            raise RuntimeError(f"procrastinate seed failed: {seed.stderr[-2000:]}")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM (ANALYZE)")
        load = LoadWatch()
        procs = [
            Proc(
                f"procrastinate-{i}-{time.time_ns()}",
                [str(PROCRASTINATE_PY), str(PROCRASTINATE_SCRIPT), "work", url, str(concurrency)],
                ctx.logdir,
                cwd=PEERS,
            )
            for i in range(workers)
        ]
        try:
            finished = _watch(
                f"procrastinate W={workers} concurrency={concurrency}",
                url,
                jobs,
                "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'",
                procs,
                max(120.0, jobs / 50),
            )
        finally:
            stop_all(procs)
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE type = 'succeeded'),"
                " min(at) FILTER (WHERE type = 'started'), "
                "max(at) FILTER (WHERE type = 'succeeded') FROM procrastinate_events"
            ).fetchone()
        assert row is not None
        return _rate(row[0], row[1], row[2]) | {"timed_out": not finished, "load": load.finish()}
    finally:
        ctx.pg.drop(name)


def river_burn(ctx: Context, *, jobs: int) -> dict[str, Any]:
    """`river bench -n N` on our server: one client, 2,000 workers (peers/river/main.go).

    The program computes its figure from the database's clock and prints it as a JSON line;
    should it not get that far (a timeout), the figure is read from river_job here, to the last
    finalized_at (the worker's clock, before the completer's final flush)."""
    name = ctx.pg.database("river")
    url = ctx.pg.url(name)
    try:
        _seed("river", [str(RIVER), "seed", url, str(jobs)], url)
        load = LoadWatch()
        proc = Proc(
            f"river-{time.time_ns()}",
            [str(RIVER), "work", url, str(jobs)],
            ctx.logdir,
            stdout_pipe=True,
        )
        output = ""
        try:
            finished = _watch(
                "river 1 client, 2,000 workers",
                url,
                jobs,
                "SELECT count(*) FROM river_job WHERE state <> 'completed'",
                [proc],
                max(120.0, jobs / 200),
                exits_when_done=True,
            )
            if finished:
                proc.popen.wait(30)
            if not proc.alive() and proc.popen.stdout is not None:
                output = proc.popen.stdout.read().decode(errors="replace")
        finally:
            stop_all([proc])
        lines = [line for line in output.splitlines() if line.startswith("{")]
        if lines:
            reported = json.loads(lines[-1])
            for line in output.splitlines():
                if not line.startswith("{"):
                    say(f"[peers] {line}")
            out = {
                k: reported[k]
                for k in (
                    "completed",
                    "seconds",
                    "jobs_per_second",
                    "finalized_span_seconds",
                    "jobs_per_second_finalized_at",
                    "wall_seconds",
                    "max_workers",
                    "fetch_cooldown_ms",
                    "fetch_poll_interval_ms",
                )
            }
        else:
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE state = 'completed'), min(attempted_at),"
                    " max(finalized_at) FROM river_job"
                ).fetchone()
            assert row is not None
            out = _rate(row[0], row[1], row[2]) | {"clock": "finalized_at (no JSON line)"}
        return out | {"timed_out": not finished, "load": load.finish()}
    finally:
        ctx.pg.drop(name)


def _seed(peer: str, command: list[str], url: str, cwd: Path | None = None) -> None:
    """Run a peer's own seeding command, then VACUUM (ANALYZE) its database, as ours is."""
    seed = subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=600)
    if seed.returncode != 0:
        raise RuntimeError(f"{peer} seed failed: {seed.stderr[-2000:]}")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")
