"""PostgreSQL's CPU per claim statement, by claim size: what a claim costs per call and per row
(issue 20; docs/performance.md, "What a claim costs per call").

    python -m benchmarks.probes.claimcalls [--sizes 1,10,100,400] [--rows R] [--rounds N]

A fresh embedded PostgreSQL, `notify-queue migrate`, and due notifications seeded (each its own
recipient, as the cost scenario's). One connection in autocommit then claims with the worker's own
statement (the named query `claim`, one round trip: lock, admit, commit), about R rows at each
size in turn, alternating sizes within each round; the backend's CPU (user + system, from /proc)
is read around each size's calls. No worker, no contention: the server's own cost of the
statement. The figures per size are CPU per call and per row; a least-squares line through
(1/size, CPU per row) over every run gives the cost per call (its slope) and per row (its
intercept). Writes `benchmarks/results/claimcalls/<timestamp>.json`.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import psutil
import psycopg

from benchmarks import alternating, queue
from benchmarks.env import fresh_postgres
from benchmarks.probes import plancost
from notify_queue.repositories.queries import QUERIES

RESULTS = Path(__file__).parent.parent / "results" / "claimcalls"


def _params(limit: int) -> dict[str, Any]:
    """The claim in one call (no candidates given: lock, then admit), up to `limit` rows from
    every lane, with plancost's parameters (the worker's defaults: 10 per recipient an hour)."""
    return {**plancost.admit_params([]), "ids": None, "limit": limit}


def _claims(
    conn: psycopg.Connection[Any], backend: psutil.Process, size: int, rows: int
) -> dict[str, Any]:
    calls = max(rows // size, 1)
    # Warm: the plans of the function's statements are made once per connection.
    conn.execute(QUERIES["claim"], _params(size)).fetchall()
    before = sum(backend.cpu_times()[:2])
    claimed = sum(
        len(conn.execute(QUERIES["claim"], _params(size)).fetchall()) for _ in range(calls)
    )
    cpu = sum(backend.cpu_times()[:2]) - before
    if claimed != calls * size:
        raise RuntimeError(f"claimed {claimed} rows in {calls} calls of {size}: seed more")
    return {
        "size": size,
        "calls": calls,
        "cpu_us_per_call": round(cpu / calls * 1e6, 1),
        "cpu_us_per_row": round(cpu / claimed * 1e6, 2),
    }


def fit(runs: list[dict[str, Any]]) -> dict[str, float]:
    """CPU per row = per_row + per_call / size, fitted over every run (least squares)."""
    xs = [1 / r["size"] for r in runs]
    ys = [r["cpu_us_per_row"] for r in runs]
    slope, intercept = statistics.linear_regression(xs, ys)
    return {"per_call_us": round(slope, 1), "per_row_us": round(intercept, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,10,100,400")
    ap.add_argument("--rows", type=int, default=4_000, help="rows claimed per size per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--output-dir", type=Path, default=RESULTS)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    # Each size claims at least one call's worth, plus its warm-up call.
    per_round = sum(max(args.rows // s, 1) * s + s for s in sizes)
    with fresh_postgres("claimcalls") as pg:
        url = pg.url(pg.database("claimcalls"))
        queue.migrate(url)
        queue.seed_due(url, per_round * args.rounds)
        with psycopg.connect(url, autocommit=True) as conn:
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert pid is not None
            backend = psutil.Process(pid[0])
            runs = alternating.alternate(
                args.rounds,
                [str(s) for s in sizes],
                lambda size: _claims(conn, backend, int(size), args.rows),
                lambda run: (
                    f"{run['calls']} calls, {run['cpu_us_per_call']} us per call,"
                    f" {run['cpu_us_per_row']} us per row"
                ),
                key="claim size",
            )
    fitted = fit(runs)
    print(f"fitted: {fitted['per_call_us']} us per call + {fitted['per_row_us']} us per row")
    medians = alternating.medians(
        runs, [str(s) for s in sizes], ("cpu_us_per_call", "cpu_us_per_row"), key="claim size"
    )
    alternating.write(
        args.output_dir,
        {"rows_per_size": args.rows, "runs": runs, "medians": medians, "fit": fitted},
    )


if __name__ == "__main__":
    main()
