"""7. A backlog drained against a rate-limited provider (issue 11): N due notifications, 2
workers, one HTTP provider with `rateLimit: {perSecond: R}` in a providers file. The provider is a
process of its own that stamps each arrival; the figures are its measured rate and the busiest
one-second window (target: within 5% of R, never above it)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

from benchmarks import timing_provider
from benchmarks.burn import burn_down
from benchmarks.context import Context
from benchmarks.progress import say


def run(ctx: Context) -> None:
    n = ctx.sizes.provider_limit_notifications
    per_second = ctx.sizes.provider_limit_per_second
    arrivals_file = Path(ctx.logdir) / f"arrivals-{time.time_ns()}.json"
    provider, port = timing_provider.start(arrivals_file)
    providers_file = Path(ctx.logdir) / "providers.yaml"
    providers_file.write_text(
        yaml.safe_dump(
            {
                "providers": [
                    {
                        "name": "limited",
                        "type": "http",
                        "channels": ["email", "sms", "push", "voice"],
                        "url": f"http://127.0.0.1:{port}/send",
                        "rateLimit": {"perSecond": per_second},
                    }
                ]
            }
        )
    )
    say(f"[provider_limit] {n:,} due, 2 workers, provider limited to {per_second:g}/s")
    try:
        figures = burn_down(
            ctx,
            label=f"provider limit {per_second:g}/s",
            notifications=n,
            workers=2,
            webhooks=False,
            extra=["--providers-file", str(providers_file), "--rate-limit", "1000000"],
            timeout_seconds=n / per_second * 2 + 60,
        )
    finally:
        provider.terminate()
        provider.wait(timeout=30)
    times = sorted(json.loads(arrivals_file.read_text()))
    busiest = timing_provider.busiest_second(times)
    measured = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
    load = figures.pop("load")
    ctx.record(
        "provider_limit",
        f"backlog drained against a provider limited to {per_second:g}/s",
        {
            **figures,
            "provider_calls": len(times),
            "measured_rate_per_second": round(measured, 1),
            "rate_vs_limit": round(measured / per_second, 3),
            "busiest_second": busiest,
        },
        load=load,
        params={"notifications": n, "workers": 2, "per_second": per_second},
    )
