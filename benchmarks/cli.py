"""`python -m benchmarks`: run the scenarios, write the JSON, print the table."""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

from benchmarks import costtable, report
from benchmarks.context import FULL, QUICK, SMOKE, Context
from benchmarks.env import BenchPostgres, machine_info
from benchmarks.procs import Receiver
from benchmarks.progress import say

SCENARIOS = [
    "throughput",
    "ingest",
    "latency",
    "scale",
    "priority",
    "peers",
    "provider_limit",
    "relay",
    "cost",
    "citus",
]
RESULTS = Path(__file__).resolve().parent / "results"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller sizes: a few minutes")
    size.add_argument(
        "--smoke", action="store_true", help="tiny sizes: checks the harness, measures nothing"
    )
    p.add_argument("--only", help=f"comma-separated scenarios ({','.join(SCENARIOS)})")
    p.add_argument("--skip", help="comma-separated scenarios to leave out")
    p.add_argument("--notifications", type=int, help="override N of the burn-downs")
    p.add_argument(
        "--workers", help="comma-separated worker counts for the throughput runs, e.g. 1,2,4"
    )
    p.add_argument("--rounds", type=int, help="repeat the burn-downs (interleaved with the peers)")
    p.add_argument(
        "--worker-arg",
        action="append",
        default=[],
        help="extra flag for every notify-queue worker (repeatable), "
        "e.g. --worker-arg=--batch-size=500",
    )
    p.add_argument(
        "--output-dir", type=Path, default=RESULTS, help="where <timestamp>.json and latest.json go"
    )
    p.add_argument(
        "--keep-workdir", action="store_true", help="keep logs and the database directory"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    sizes = {"smoke": SMOKE, "quick": QUICK, "full": FULL}[mode]
    if args.notifications:
        sizes.notifications = sizes.peer_notifications = args.notifications
        sizes.cost_notifications = sizes.citus_notifications = args.notifications
    if args.workers:
        sizes.workers = [int(w) for w in args.workers.split(",")]
    if args.rounds:
        sizes.rounds = args.rounds
    chosen = [s.strip() for s in args.only.split(",")] if args.only else list(SCENARIOS)
    if args.skip:
        chosen = [s for s in chosen if s not in args.skip.split(",")]
    unknown = [s for s in chosen if s not in SCENARIOS]
    if unknown:
        print(
            f"unknown scenario(s): {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}",
            file=sys.stderr,
        )
        return 2

    started = datetime.now(UTC)
    workdir = Path(tempfile.mkdtemp(prefix="nq-bench-"))
    say(f"notify-queue benchmarks ({mode}): {', '.join(chosen)}; work directory {workdir}")
    doc: dict[str, object] = {
        "schema": 1,
        "mode": mode,
        "command": "python -m benchmarks " + " ".join(argv or sys.argv[1:]),
        "started_at": started.isoformat(),
        "machine": machine_info(),
        "scenarios": chosen,
    }
    pg = BenchPostgres(workdir)
    receiver = Receiver(workdir)
    ctx = Context(
        mode=mode,
        sizes=sizes,
        pg=pg,
        workdir=workdir,
        receiver=receiver,
        worker_args=args.worker_arg,
    )
    errors: dict[str, str] = {}
    try:
        doc["postgres"] = pg.settings()
        for name in chosen:
            t0 = time.monotonic()
            say(f"== {name} ==")
            try:
                importlib.import_module(f"benchmarks.scenarios.{name}").run(ctx)
            except Exception as exc:  # one scenario failing must not lose the others' figures
                errors[name] = "".join(traceback.format_exception(exc))[-4000:]
                say(f"[{name}] failed: {exc}")
            say(f"== {name} done in {time.monotonic() - t0:.0f}s ==")
    finally:
        receiver.stop()
        pg.stop()
        if not args.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    doc["finished_at"] = datetime.now(UTC).isoformat()
    doc["results"] = ctx.results
    doc["notes"] = ctx.notes
    doc["errors"] = errors
    doc["targets"] = report.targets(ctx.results)
    doc["comparisons"] = report.comparisons(ctx.results)
    # A cost-only (citus-only) run has its own files (<ts>-cost.json, latest-cost.json), so the
    # suite's latest.json, which docs/performance.md's tables come from, stays the suite's.
    label = None
    if chosen in (["cost"], ["citus"]):
        label = chosen[0] if mode == "full" else f"{chosen[0]}-{mode}"
    path = report.write(doc, args.output_dir, started, label=label)
    print(report.table(doc))
    if "cost" in chosen:
        print()
        print(costtable.render(doc))
    say(f"results: {path}")
    return 1 if errors else 0
