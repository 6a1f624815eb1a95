"""What reading a statement's answer costs the process, per row, by the shape it is read in
(docs/performance.md, "The enqueue's answer as arrays" and "The claim's rows as named tuples").

    python -m benchmarks.probes.rowshapes [--rows N] [--repeat R]

On an embedded PostgreSQL, two answers with the columns and types of the product's statements,
each read in the shape the product used before and the one it uses now, through psycopg with the
product's JSON loader:

- the batch enqueue's answer (nq_enqueue_pending: id, max_attempts, two times, the three waiting
  fields, metadata) for N rows: N rows as dicts, against one row of arrays (and one time for all);
- a claimed row (nq_claim's 35 columns, filled as for a plain email notification) for N rows:
  dicts of text values, against named tuples of binary values.

Only the reading is timed (the statement has run and its answer arrived when `fetchall` starts),
the best of R, in µs per row; the shapes are built from the same values, so the difference is the
driver's and the row factory's. Writes `benchmarks/results/rowshapes/<timestamp>.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row, namedtuple_row
from psycopg.types.json import set_json_loads

from benchmarks import alternating
from benchmarks.env import fresh_postgres
from notify_queue.repositories.db import _json_loads

RESULTS = Path(__file__).parent.parent / "results" / "rowshapes"

# nq_enqueue_pending's columns for a plain item due now.
_ENQUEUED = {
    "id": "gen_random_uuid()",
    "max_attempts": "6",
    "created_at": "now()",
    "updated_at": "now()",
    "waiting_reason": "NULL::text",
    "waiting_until": "NULL::timestamptz",
    "waiting_detail": "NULL::text",
    "metadata": "'{}'::jsonb",
}
# nq_claim's columns (0042), in its order, for an address-targeted email.
_CLAIMED = {
    "screen": "false",
    "deferred_channels": "'{}'::text[]",
    "status_writes_noted": "0",
    "escalation_steps_stopped": "0",
    "id": "gen_random_uuid()",
    "channel": "'email'",
    "recipient": "'user' || g || '@example.com'",
    "subject": "'Your receipt'",
    "body": "repeat('x', 120)",
    "metadata": "'{}'::jsonb",
    "attempt_count": "1",
    "max_attempts": "6",
    "priority": "1::smallint",
    "backoff_base_seconds": "0.5::float8",
    "backoff_max_seconds": "60::float8",
    "failover": "NULL::text",
    "providers": "NULL::text[]",
    "category": "'transactional'",
    "expires_at": "NULL::timestamptz",
    "recipient_id": "NULL::text",
    "recipient_exists": "NULL::boolean",
    "timezone": "NULL::text",
    "opt_out_all": "NULL::boolean",
    "opt_out_channels": "NULL::text[]",
    "opt_out_categories": "NULL::text[]",
    "quiet_start": "NULL::time",
    "quiet_end": "NULL::time",
    "bound_provider": "'simulated'",
    "sticky_provider": "NULL::text",
    "next_attempt_at": "now()",
    "created_at": "now()",
    "send_at": "now()",
    "traceparent": "NULL::text",
    "digest_id": "NULL::uuid",
    "digest_bucket": "NULL::smallint",
}


def _rows(columns: dict[str, str], rows: int) -> str:
    listed = ", ".join(f"{value} AS {name}" for name, value in columns.items())
    return f"SELECT {listed} FROM generate_series(1, {rows}) AS g"


def _arrays(columns: dict[str, str], rows: int) -> str:
    """One row: an array per column, a scalar for the two times (as notification_enqueue_pending
    reads them)."""
    once = ("created_at", "updated_at")
    listed = ", ".join(
        f"min(r.{name}) AS {name}" if name in once else f"array_agg(r.{name}) AS {name}"
        for name in columns
    )
    return f"SELECT {listed} FROM ({_rows(columns, rows)}) AS r"


async def _read(
    conn: psycopg.AsyncConnection[Any], query: str, row_factory: Any, binary: bool, repeat: int
) -> float:
    """The best of `repeat` reads of the answer, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        cur = conn.cursor(row_factory=row_factory, binary=binary)
        await cur.execute(query, prepare=True)
        started = time.perf_counter()
        await cur.fetchall()
        best = min(best, time.perf_counter() - started)
    return best


async def measure(url: str, rows: int, repeat: int) -> dict[str, float]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        set_json_loads(_json_loads, conn)
        shapes = {
            "enqueue answer, rows as dicts (binary)": (_rows(_ENQUEUED, rows), dict_row, True),
            "enqueue answer, one row of arrays (binary)": (
                _arrays(_ENQUEUED, rows),
                dict_row,
                True,
            ),
            "claimed row, dicts of text": (_rows(_CLAIMED, rows), dict_row, False),
            "claimed row, named tuples (binary)": (_rows(_CLAIMED, rows), namedtuple_row, True),
        }
        return {
            name: round(await _read(conn, query, factory, binary, repeat) / rows * 1e6, 3)
            for name, (query, factory, binary) in shapes.items()
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000)
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--output-dir", type=Path, default=RESULTS)
    args = ap.parse_args()
    with fresh_postgres("rowshapes") as pg:
        figures = asyncio.run(measure(pg.url(), args.rows, args.repeat))
    for name, us in figures.items():
        print(f"{us:8.3f} us per row  {name}")
    params = {"rows": args.rows, "repeat": args.repeat}
    alternating.write(args.output_dir, {"params": params, "us_per_row": figures})


if __name__ == "__main__":
    main()
