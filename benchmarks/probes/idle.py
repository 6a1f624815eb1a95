"""What an idle worker costs the database: statements per second, by statement (issue 20, item 4).

A fresh embedded PostgreSQL with `pg_stat_statements` (`track = all`, so statements inside
functions and triggers count too), a migrated empty database, one `notify-queue worker` process
(the default configuration: webhook dispatch on, the simulated provider), a warm-up so the start's
own statements (partitions, provider rows) are not counted, then `--seconds` of nothing to do.

    .venv/bin/python -m benchmarks.probes.idle --seconds 60 [worker flags...]

Prints one line per statement (calls, calls per second, top-level or nested) and the total. The
harness's own reads (of pg_stat_statements) are left out.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from benchmarks.procs import Proc
from notify_queue.embedded import EmbeddedPostgres

_SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "all",
    "fsync": "off",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warm-up", type=float, default=5.0)
    args, worker_args = parser.parse_known_args(argv)
    root = Path(tempfile.mkdtemp(prefix="nq-idle-"))
    server = EmbeddedPostgres(root / "pg", delete_on_stop=True)
    try:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            for name, value in _SETTINGS.items():
                conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        server.halt()
        server.resume()
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE idle")
        url = server.url("idle")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
        base = [sys.executable, "-m", "notify_queue"]
        migrate = Proc("migrate", [*base, "migrate", "--database-url", url], root)
        if migrate.popen.wait(120) != 0:
            raise SystemExit(f"migrate failed:\n{migrate.log_tail()}")
        migrate.stop()
        worker = Proc("worker", [*base, "worker", "--database-url", url, *worker_args], root)
        try:
            time.sleep(args.warm_up)
            if not worker.alive():
                raise SystemExit(f"worker died:\n{worker.log_tail()}")
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("SELECT pg_stat_statements_reset()")
            started = time.monotonic()
            time.sleep(args.seconds)
            with psycopg.connect(url, autocommit=True) as conn:
                rows = conn.execute(
                    """SELECT calls, toplevel, left(regexp_replace(query, '\\s+', ' ', 'g'), 100)
                       FROM pg_stat_statements
                       WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'idle')
                         AND query NOT ILIKE '%pg_stat_statements%'
                       ORDER BY calls DESC"""
                ).fetchall()
            elapsed = time.monotonic() - started
            if not worker.alive():
                raise SystemExit(f"worker died:\n{worker.log_tail()}")
        finally:
            worker.stop()
        total = sum(r[0] for r in rows)
        print(f"idle worker {' '.join(worker_args)}: {elapsed:.0f} s")
        print(f"{'calls':>7} {'per s':>7}  level   statement")
        for calls, toplevel, query in rows:
            level = "top" if toplevel else "nested"
            print(f"{calls:>7} {calls / elapsed:>7.3f}  {level:<7} {query}")
        top = sum(r[0] for r in rows if r[1])
        print(
            f"total: {total} statements, {total / elapsed:.3f}/s"
            f" ({top} top-level, {top / elapsed:.3f}/s)"
        )
        return 0
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
