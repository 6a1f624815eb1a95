"""1. End-to-end throughput: N due notifications, W worker processes, the simulated provider with
no latency, rate limiting and webhook events on (each event POSTed to the counting receiver).
Then the same with 10% temporary failures and a small backoff."""

from __future__ import annotations

from benchmarks.burn import burn_down
from benchmarks.context import TUNED_WORKER_FLAGS, Context
from benchmarks.progress import say


def run(ctx: Context) -> None:
    n = ctx.sizes.notifications
    for workers in ctx.sizes.workers:
        for round_ in range(ctx.sizes.rounds):
            # Every worker count with the tuned flags; the defaults at two workers.
            for tuned in (False, True) if workers == 2 or len(ctx.sizes.workers) == 1 else (True,):
                flags = TUNED_WORKER_FLAGS if tuned else []
                config = "tuned" if tuned else "defaults"
                label = f"throughput W={workers} {config} round {round_ + 1}"
                say(
                    f"[throughput] {n:,} due, {workers} workers ({config}), "
                    "rate limiting + webhooks"
                )
                figures = burn_down(ctx, label=label, notifications=n, workers=workers, extra=flags)
                load = figures.pop("load")
                ctx.record(
                    "throughput",
                    f"e2e rate-limit+webhooks W={workers} {config}",
                    figures,
                    load=load,
                    params={
                        "notifications": n,
                        "workers": workers,
                        "round": round_ + 1,
                        "worker_flags": flags,
                        "failure_rate": 0.0,
                        "webhooks": True,
                    },
                )
    workers = ctx.sizes.failure_workers
    extra = [
        *TUNED_WORKER_FLAGS,
        "--sim-failure-rate",
        "0.1",
        "--backoff-base",
        "0.05",
        "--backoff-max",
        "1",
    ]
    say(f"[throughput] {n:,} due, {workers} workers, 10% temporary failures")
    figures = burn_down(
        ctx,
        label=f"throughput 10% failures W={workers}",
        notifications=n,
        workers=workers,
        extra=extra,
    )
    load = figures.pop("load")
    ctx.record(
        "throughput",
        f"e2e 10% temporary failures W={workers} tuned",
        figures,
        load=load,
        params={
            "notifications": n,
            "workers": workers,
            "failure_rate": 0.1,
            "worker_flags": extra,
            "backoff_base": 0.05,
            "backoff_max": 1.0,
            "webhooks": True,
        },
    )
