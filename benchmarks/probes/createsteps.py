"""The create path's steps, one at a time, per batch item: what `apicpu` cannot resolve when the
host drifts by more than a change is worth (docs/performance.md, "A batch item's answer, copied
less").

    python -m benchmarks.probes.createsteps [--items N] [--repeat R] [--rounds R] [--src SRC,...]

In a fresh process per run (`<checkout>/src` as its PYTHONPATH; `.` is this one, alternating
within each round as `apicpu` does): N plain batch items as the cost scenario sends them, then
each step of the API's batch path over all N, R times; the best of the R, per item. The steps are
the functions the route and the service call: the stored-text walk, the model, the request's
hash, the prepared request, the new notification, the enqueue's JSON item, the notification
rebuilt from the enqueue's row, its answer, and the create's result. No database: the row is
what `nq_enqueue_pending` returns for a plain item due now. The best of many runs is the code's
own cost with warm caches, below what the API process pays (a batch's objects are fresh memory
there): compare versions with it, not with `apicpu`'s figures. Prints one line per run and the
medians; writes `benchmarks/results/createsteps/<timestamp>.json`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import alternating
from benchmarks.scenarios.ingest import _item
from notify_queue.api.body import storable_errors
from notify_queue.api.schemas import notification_json
from notify_queue.models import CreateResult
from notify_queue.repositories.notifications import enqueue_item
from notify_queue.repositories.rows import enqueued_notifications
from notify_queue.services.notifications import _plain
from notify_queue.services.validation import parse_request, prepare_request, request_hash

RESULTS = Path(__file__).parent.parent / "results" / "createsteps"


def _steps(items: int) -> dict[str, Callable[[], object]]:
    """Each step over `items` plain batch items, with what it needs made beforehand."""
    sent = []
    for _ in range(items):
        key = f"createsteps-{uuid.uuid4().hex}"
        sent.append(_item(key) | {"idempotencyKey": key})
    now = datetime.now(UTC)
    requests = [parse_request(item) for item in sent]
    prepared = [
        prepare_request(r, idempotency_key=i["idempotencyKey"], request_digest="0" * 64, now=now)
        for r, i in zip(requests, sent, strict=True)
    ]
    new = [_plain(p) for p in prepared]
    # notification_enqueue_pending's one row of arrays, as the driver gives it.
    row: dict[str, Any] = {
        "ids": [n.id for n in new],
        "max_attempts": [6] * len(new),
        "created_at": now,
        "updated_at": now,
        "created_ats": None,
        "updated_ats": None,
        "waiting_reasons": [None] * len(new),
        "waiting_untils": [None] * len(new),
        "waiting_details": [None] * len(new),
        "metadata": [{} for _ in new],
    }
    stored = enqueued_notifications(new, row)
    return {
        "stored text": lambda: [storable_errors(item) for item in sent],
        "model": lambda: [parse_request(item) for item in sent],
        "request hash": lambda: [request_hash(item) for item in sent],
        "prepared request": lambda: [
            prepare_request(r, idempotency_key="k", request_digest="0" * 64, now=now)
            for r in requests
        ],
        "new notification": lambda: [_plain(p) for p in prepared],
        "enqueue item": lambda: [enqueue_item(i, n) for i, n in enumerate(new)],
        "notification from the row": lambda: enqueued_notifications(new, row),
        "answer": lambda: [notification_json(n) for n in stored],
        "create result": lambda: [CreateResult(n, created=True) for n in stored],
    }


def child(items: int, repeat: int) -> dict[str, float]:
    """Each step's best of `repeat`, in µs per item, and their sum."""
    out: dict[str, float] = {}
    for name, step in _steps(items).items():
        best = float("inf")
        for _ in range(repeat):
            started = time.perf_counter()
            step()
            best = min(best, time.perf_counter() - started)
        out[name] = round(best / items * 1e6, 3)
    out["sum"] = round(sum(out.values()), 2)
    return out


def one_run(src: str, items: int, repeat: int) -> dict[str, Any]:
    env = alternating.checkout_environment(src)
    command = [sys.executable, "-m", "benchmarks.probes.createsteps", "--child"]
    command += ["--items", str(items), "--repeat", str(repeat)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    figures: dict[str, Any] = json.loads(done.stdout)
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=1_000)
    ap.add_argument("--repeat", type=int, default=200)
    alternating.add_arguments(ap, RESULTS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.items, args.repeat)))
        return
    sources = args.src.split(",")
    runs = alternating.alternate(
        args.rounds,
        sources,
        lambda src: one_run(src, args.items, args.repeat),
        lambda run: f"{run['sum']} us per item over the steps",
    )
    steps = [k for k in runs[0] if k not in ("src", "round")]
    medians = alternating.medians(runs, sources, steps)
    params = {k: v for k, v in vars(args).items() if k not in ("output_dir", "child")}
    alternating.write(args.output_dir, {"params": params, "runs": runs, "medians": medians})


if __name__ == "__main__":
    main()
