"""What the Citus distribution column costs on plain PostgreSQL (issue 21, item 1: "on plain
PostgreSQL the bucket costs nothing measurable; say what it costs"; docs/scaling.md).

Every per-notification table carries `bucket` (smallint, the recipient's bucket, nq_bucket): the
queue row, the log row and the recipient's rate window, whose key is (bucket, recipient). On one
server nothing routes by it. What it costs there, measured on twins of the tables with and
without the column, filled with the same rows:

- bytes per row and WAL per insert: a fresh embedded PostgreSQL, `notify-queue migrate`, N
  notifications made by the API's own batch statement (benchmarks.probes.plancost.ingest,
  200-character bodies, each its own recipient); their rows copied into a twin of nq_jobs and
  of the log with and without `bucket` (CREATE TABLE AS, so the column is absent, not
  dropped), and one window per recipient into a twin of nq_rate_windows keyed (bucket,
  recipient) and one keyed (recipient); WAL from pg_current_wal_insert_lsn around each insert,
  sizes from pg_relation_size (the heap) and pg_indexes_size;
- CPU of nq_bucket: `count(nq_bucket(recipient))` against `count(recipient)` over the N rows,
  the best of --rounds each, per call.

    .venv/bin/python -m benchmarks.probes.bucketcost --notifications 20000

Prints the table and writes JSON to benchmarks/results/bucketcost/ (or --output-dir).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from benchmarks import queue
from benchmarks.env import fresh_postgres
from benchmarks.probes.plancost import ingest

RESULTS = Path(__file__).parent.parent / "results" / "bucketcost"


def _columns(conn: psycopg.Connection[Any], table: str, *, without: str | None) -> str:
    rows = conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
        " AND NOT attisdropped ORDER BY attnum",
        [table],
    ).fetchall()
    return ", ".join(r[0] for r in rows if r[0] != without)


def _lsn(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def _twin(
    conn: psycopg.Connection[Any], name: str, select: str, key: str | None, rows: int
) -> dict[str, float]:
    """`name` made from `select` (structure only), then filled by it: WAL and bytes per row."""
    conn.execute(f"CREATE TABLE {name} AS {select} WITH NO DATA")
    if key:
        conn.execute(f"ALTER TABLE {name} ADD PRIMARY KEY ({key})")
    before = _lsn(conn)
    conn.execute(f"INSERT INTO {name} {select}")
    wal = _lsn(conn) - before
    sizes = conn.execute(
        "SELECT pg_relation_size(%s::regclass), pg_indexes_size(%s::regclass)", [name, name]
    ).fetchone()
    tuple_bytes = conn.execute(f"SELECT avg(pg_column_size(t.*)) FROM {name} t").fetchone()
    assert sizes is not None and tuple_bytes is not None
    return {
        "tuple_bytes": float(tuple_bytes[0]),
        "wal_bytes_per_row": wal / rows,
        "heap_bytes_per_row": sizes[0] / rows,
        "index_bytes_per_row": sizes[1] / rows,
    }


def _best_seconds(conn: psycopg.Connection[Any], query: str, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        conn.execute(query).fetchall()
        best = min(best, time.perf_counter() - started)
    return best


def measure(n: int, rounds: int) -> dict[str, Any]:
    with fresh_postgres("bucketcost") as pg:
        name = pg.database("bucket")
        queue.migrate(pg.url(name))
        asyncio.run(ingest(pg.url(name), n, subject=None, body_chars=200))
        with psycopg.connect(pg.url(name), autocommit=True) as conn:
            # Hint bits set and pages frozen before anything is counted: with data checksums
            # (PostgreSQL 18's default) the first read of a page after a checkpoint that sets
            # its hint bits logs the whole page, which the first twin filled would pay.
            conn.execute("VACUUM (FREEZE) nq_jobs")
            jobs = _columns(conn, "nq_jobs", without=None)
            jobs_less = _columns(conn, "nq_jobs", without="bucket")
            log_cols = _columns(conn, "nq_delivery_log", without=None)
            log_less = _columns(conn, "nq_delivery_log", without="bucket")
            # The log's rows as a completion writes them: the queue row's columns it keeps.
            log_from_jobs = ", ".join(
                c if c in jobs.split(", ") else f"NULL::{t} AS {c}"
                for c, t in conn.execute(
                    "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
                    " WHERE attrelid = 'nq_delivery_log'::regclass AND attnum > 0"
                    " AND NOT attisdropped ORDER BY attnum"
                ).fetchall()
            )
            window = (
                "SELECT bucket, recipient, ARRAY[id] AS ids, ARRAY[now()] AS taken,"
                " now() AS last_taken_at FROM nq_jobs"
            )
            window_less = (
                "SELECT recipient, ARRAY[id] AS ids, ARRAY[now()] AS taken,"
                " now() AS last_taken_at FROM nq_jobs"
            )
            tables = {
                "queue row (nq_jobs)": (
                    _twin(conn, "twin_jobs", f"SELECT {jobs} FROM nq_jobs", "id", n),
                    _twin(conn, "twin_jobs_less", f"SELECT {jobs_less} FROM nq_jobs", "id", n),
                ),
                "log row (nq_delivery_log)": (
                    _twin(
                        conn,
                        "twin_log",
                        f"SELECT {log_cols} FROM (SELECT {log_from_jobs} FROM nq_jobs) l",
                        "id",
                        n,
                    ),
                    _twin(
                        conn,
                        "twin_log_less",
                        f"SELECT {log_less} FROM (SELECT {log_from_jobs} FROM nq_jobs) l",
                        "id",
                        n,
                    ),
                ),
                "rate window (nq_rate_windows), keyed": (
                    _twin(conn, "twin_windows", window, "bucket, recipient", n),
                    _twin(conn, "twin_windows_less", window_less, "recipient", n),
                ),
            }
            with_hash = _best_seconds(
                conn, "SELECT count(nq_bucket(recipient)) FROM twin_jobs", rounds
            )
            without_hash = _best_seconds(conn, "SELECT count(recipient) FROM twin_jobs", rounds)
    return {
        "notifications": n,
        "tables": {
            table: {"with_bucket": a, "without_bucket": b} for table, (a, b) in tables.items()
        },
        "nq_bucket_us_per_call": max(with_hash - without_hash, 0.0) / n * 1e6,
    }


def _print(result: dict[str, Any]) -> None:
    print(f"The bucket column on plain PostgreSQL, {result['notifications']:,} notifications")
    print("| table | row B, with / without | WAL B per insert | heap B per row | index B per row |")
    print("|---|---|---|---|---|")
    for table, pair in result["tables"].items():
        a, b = pair["with_bucket"], pair["without_bucket"]
        print(
            f"| {table} | {a['tuple_bytes']:,.1f} / {b['tuple_bytes']:,.1f} "
            f"| {a['wal_bytes_per_row']:,.1f} / {b['wal_bytes_per_row']:,.1f} "
            f"| {a['heap_bytes_per_row']:,.1f} / {b['heap_bytes_per_row']:,.1f} "
            f"| {a['index_bytes_per_row']:,.1f} / {b['index_bytes_per_row']:,.1f} |"
        )
    print(f"nq_bucket(recipient): {result['nq_bucket_us_per_call']:.3f} µs per call")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notifications", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    result = measure(args.notifications, args.rounds)
    _print(result)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    path = args.output_dir / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-bucketcost.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"results: {path}")


if __name__ == "__main__":
    main()
