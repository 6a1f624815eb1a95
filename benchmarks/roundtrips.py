"""What a round trip to PostgreSQL costs the client's CPU, by the shape of a transaction
(docs/performance.md, "Two round trips fewer per batch").

    python -m benchmarks.roundtrips [--transactions N] [--rounds R]

A fresh embedded PostgreSQL and one asyncio psycopg connection (the worker's driver and loop), then
the same one-statement transaction (`SELECT 1`) in each shape, N times per round, the shapes
alternating within each round; this process's user + system CPU per transaction:

- `psycopg_transaction`: psycopg's own transaction (BEGIN sent alone), the drain's settings as a
  statement of their own, the statement, COMMIT: four round trips, the drain's shape until
  2026-12-05;
- `drain_begin`: BEGIN and the settings as one simple query (`drain_begin`, delivery.sql), the
  statement, COMMIT: three;
- `autocommit`: the statement alone: one;
- `pipeline`: psycopg's pipeline mode around the first shape (one network flush for all four).

Prints one line per shape and round and the medians; writes
`benchmarks/results/roundtrips/<timestamp>.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import tempfile
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.env import BenchPostgres, machine_info
from notify_queue.repositories.queries import QUERIES

RESULTS = Path(__file__).parent / "results" / "roundtrips"
_SETTINGS = (
    "SELECT set_config('enable_seqscan', 'off', true),"
    " set_config('plan_cache_mode', 'force_generic_plan', true)"
)
Shape = Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]


async def _psycopg_transaction(conn: psycopg.AsyncConnection[Any]) -> None:
    async with conn.transaction():
        await conn.execute(_SETTINGS)
        await (await conn.execute("SELECT 1")).fetchall()


async def _drain_begin(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute(QUERIES["drain_begin"], prepare=False)
    await (await conn.execute("SELECT 1")).fetchall()
    await conn.execute("COMMIT", prepare=False)


async def _autocommit(conn: psycopg.AsyncConnection[Any]) -> None:
    await (await conn.execute("SELECT 1")).fetchall()


async def _pipeline(conn: psycopg.AsyncConnection[Any]) -> None:
    async with conn.pipeline():
        async with conn.transaction():
            await conn.execute(_SETTINGS)
            cur = await conn.execute("SELECT 1")
        await cur.fetchall()


SHAPES: dict[str, tuple[int, Shape]] = {
    "psycopg_transaction": (4, _psycopg_transaction),
    "drain_begin": (3, _drain_begin),
    "autocommit": (1, _autocommit),
    "pipeline": (4, _pipeline),
}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _rounds(url: str, transactions: int, rounds: int) -> list[dict[str, Any]]:
    runs = []
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for round_ in range(rounds):
            for name, (round_trips, shape) in SHAPES.items():
                for _ in range(100):  # warm: prepared statements, caches
                    await shape(conn)
                before = _cpu()
                for _ in range(transactions):
                    await shape(conn)
                us = (_cpu() - before) / transactions * 1e6
                runs.append(
                    {
                        "round": round_ + 1,
                        "shape": name,
                        "statements": round_trips,
                        "client_cpu_us_per_transaction": round(us, 1),
                    }
                )
                print(f"round {round_ + 1} {name}: {us:.1f} us of client CPU per transaction")
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transactions", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--output-dir", type=Path, default=RESULTS)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nq-roundtrips-") as tmp:
        pg = BenchPostgres(Path(tmp))
        try:
            runs = asyncio.run(_rounds(pg.url(), args.transactions, args.rounds))
        finally:
            pg.stop()
    medians = {
        name: statistics.median(
            r["client_cpu_us_per_transaction"] for r in runs if r["shape"] == name
        )
        for name in SHAPES
    }
    for name, median in medians.items():
        print(f"median {name}: {median:.1f} us")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    out = args.output_dir / f"{stamp}.json"
    params = {k: v for k, v in vars(args).items() if k != "output_dir"}
    document = {"machine": machine_info(), "params": params, "runs": runs, "medians": medians}
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"results: {out}")


if __name__ == "__main__":
    main()
