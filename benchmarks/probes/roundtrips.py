"""What a round trip to PostgreSQL costs the client's CPU, by the shape of a transaction
(docs/performance.md, "Two round trips fewer per batch").

    python -m benchmarks.probes.roundtrips [--transactions N] [--rounds R]

A fresh embedded PostgreSQL and one asyncio psycopg connection (the worker's driver and loop), then
the same one-statement transaction (`SELECT 1`) in each shape, N times per round, the shapes
alternating within each round; this process's user + system CPU per transaction:

- `psycopg_transaction`: psycopg's own transaction (BEGIN sent alone), the drain's settings as a
  statement of their own, the statement, COMMIT: four round trips, the drain's shape until
  2026-12-05;
- `drain_begin`: BEGIN and the settings as one simple query, the statement, COMMIT: three (the
  claim's shape from then until 0042, whose functions carry the settings);
- `autocommit`: the statement alone: one (the completion's shape since 0041, the claim's since
  0042);
- `pipeline`: psycopg's pipeline mode around the first shape (one network flush for all four).

Prints one line per shape and round and the medians; writes
`benchmarks/results/roundtrips/<timestamp>.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg

from benchmarks import alternating
from benchmarks.env import fresh_postgres

RESULTS = Path(__file__).parent.parent / "results" / "roundtrips"
_SETTINGS = (
    "SELECT set_config('enable_seqscan', 'off', true),"
    " set_config('plan_cache_mode', 'force_generic_plan', true)"
)
_BEGIN_WITH_SETTINGS = (
    "BEGIN; SET LOCAL enable_seqscan = off; SET LOCAL plan_cache_mode = force_generic_plan"
)
Shape = Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]


async def _psycopg_transaction(conn: psycopg.AsyncConnection[Any]) -> None:
    async with conn.transaction():
        await conn.execute(_SETTINGS)
        await (await conn.execute("SELECT 1")).fetchall()


async def _drain_begin(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute(_BEGIN_WITH_SETTINGS, prepare=False)
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


async def _per_transaction(
    conn: psycopg.AsyncConnection[Any], shape: Shape, transactions: int
) -> float:
    for _ in range(100):  # warm: prepared statements, caches
        await shape(conn)
    before = _cpu()
    for _ in range(transactions):
        await shape(conn)
    return round((_cpu() - before) / transactions * 1e6, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transactions", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--output-dir", type=Path, default=RESULTS)
    args = ap.parse_args()
    with fresh_postgres("roundtrips") as pg:
        loop = asyncio.new_event_loop()
        try:
            conn = loop.run_until_complete(
                psycopg.AsyncConnection.connect(pg.url(), autocommit=True)
            )

            def one(name: str) -> dict[str, Any]:
                round_trips, shape = SHAPES[name]
                us = loop.run_until_complete(_per_transaction(conn, shape, args.transactions))
                return {"statements": round_trips, "client_cpu_us_per_transaction": us}

            runs = alternating.alternate(
                args.rounds,
                list(SHAPES),
                one,
                lambda run: f"{run['client_cpu_us_per_transaction']} us of client CPU",
                key="shape",
            )
            loop.run_until_complete(conn.close())
        finally:
            loop.close()
    figure = "client_cpu_us_per_transaction"
    medians = alternating.medians(runs, list(SHAPES), (figure,), key="shape")
    params = {k: v for k, v in vars(args).items() if k != "output_dir"}
    alternating.write(
        args.output_dir,
        {
            "params": params,
            "runs": runs,
            "medians": {name: m[figure] for name, m in medians.items()},
        },
    )


if __name__ == "__main__":
    main()
