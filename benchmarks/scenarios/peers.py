"""6. Side by side: the same due-job burn-down on Notify Queue, pg-boss, Procrastinate and River,
on the same PostgreSQL, interleaved round by round so a burst of load from elsewhere on the machine
hits all of them alike; the ratios are computed per round and their median reported.

Notify Queue runs with the tuned worker flags (TUNED_WORKER_FLAGS, as pg-boss gets its best
batchSize) and everything on (rate limiting, a webhook event per notification POSTed to
the receiver) and, for the like-for-like figure, with every status and webhook event row written
but the relay off (`--webhook-dispatch off`: relaying is `notify-queue relay`'s, measured alone by
the relay scenario); the peers run no-op jobs.
pg-boss is tried at several batch sizes and its best is the one compared (the conservative
choice); Procrastinate, which fetches one job per query, gets `concurrency` sub-workers per process;
River runs the way `river bench -n N` does: one client, 2,000 workers, FetchCooldown 2 ms and
FetchPollInterval 20 ms (the settings River's authors chose for its best figure), so it is not
given our worker count. River is skipped, with a note, where no Go toolchain built it.
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks import peers
from benchmarks.burn import burn_down
from benchmarks.context import TUNED_WORKER_FLAGS, Context
from benchmarks.env import LoadWatch
from benchmarks.progress import say

PGBOSS_BATCH_SIZES = {"full": [100, 1000], "quick": [100, 1000], "smoke": [100]}
PROCRASTINATE_CONCURRENCY = 16


def run(ctx: Context) -> None:
    peers.ensure_installed()
    ctx.notes.append(f"peer versions: {peers.versions()}")
    with_river = peers.river_built()
    if not with_river:
        ctx.notes.append("peers: River skipped (no Go toolchain to build peers/river)")
    n = ctx.sizes.peer_notifications
    n_proc = ctx.sizes.procrastinate_notifications
    workers = 2 if ctx.mode != "smoke" else 1
    rounds: list[dict[str, Any]] = []
    for round_ in range(ctx.sizes.rounds):
        watch = LoadWatch()
        say(f"[peers] round {round_ + 1}: {n:,} jobs, {workers} worker processes each")
        ours = burn_down(
            ctx,
            label=f"notify-queue W={workers}",
            notifications=n,
            workers=workers,
            extra=TUNED_WORKER_FLAGS,
        )
        # Like for like with the peers' jobs: every status and its webhook event row written,
        # rate limiting on, the events left to `notify-queue relay` processes.
        ours_plain = burn_down(
            ctx,
            label=f"notify-queue W={workers} relay off",
            notifications=n,
            workers=workers,
            relay=False,
            extra=TUNED_WORKER_FLAGS,
        )
        boss = {
            bs: peers.pgboss_burn(ctx, jobs=n, workers=workers, batch_size=bs)
            for bs in PGBOSS_BATCH_SIZES[ctx.mode]
        }
        proc = peers.procrastinate_burn(
            ctx, jobs=n_proc, workers=workers, concurrency=PROCRASTINATE_CONCURRENCY
        )
        river = peers.river_burn(ctx, jobs=n) if with_river else {}
        best_bs, best = max(boss.items(), key=lambda kv: kv[1].get("jobs_per_second") or 0)
        r: dict[str, Any] = {
            "round": round_ + 1,
            "notify_queue_per_second": ours.get("notifications_per_second"),
            "notify_queue_webhooks_per_second": ours.get("webhooks_per_second"),
            "notify_queue_relay_off_per_second": ours_plain.get("notifications_per_second"),
            "pgboss_per_second": best.get("jobs_per_second"),
            "pgboss_batch_size": best_bs,
            "pgboss_by_batch_size": {bs: b.get("jobs_per_second") for bs, b in boss.items()},
            "procrastinate_per_second": proc.get("jobs_per_second"),
            "procrastinate_jobs": n_proc,
            "river_per_second": river.get("jobs_per_second"),
            "river_per_second_to_last_finalized_at": river.get("jobs_per_second_finalized_at"),
            # Our CPU per notification by process (the peers' runs are not split).
            "cpu_us_per_notification": ours.get("cpu_us_per_notification"),
            "relay_off_cpu_us_per_notification": ours_plain.get("cpu_us_per_notification"),
            "load": {
                "notify_queue": ours["load"],
                "notify_queue_relay_off": ours_plain["load"],
                "pgboss": {bs: b["load"] for bs, b in boss.items()},
                "procrastinate": proc["load"],
                "river": river.get("load"),
            },
        }
        for key, peer in (
            ("pgboss", "pgboss_per_second"),
            ("procrastinate", "procrastinate_per_second"),
            ("river", "river_per_second"),
        ):
            if not r[peer]:
                continue
            if r["notify_queue_per_second"]:
                r[f"ratio_{key}"] = round(r["notify_queue_per_second"] / r[peer], 2)
            if r["notify_queue_relay_off_per_second"]:
                r[f"ratio_{key}_relay_off"] = round(
                    r["notify_queue_relay_off_per_second"] / r[peer], 2
                )
        rounds.append(r)
        ctx.record(
            "peers",
            f"round {round_ + 1} W={workers}",
            {k: v for k, v in r.items() if k != "load"},
            load=watch,
            params={
                "jobs": n,
                "workers": workers,
                "procrastinate_concurrency": PROCRASTINATE_CONCURRENCY,
                "river": {
                    k: river.get(k)
                    for k in ("max_workers", "fetch_cooldown_ms", "fetch_poll_interval_ms")
                }
                | {"clients": 1},
                "notify_queue_worker_flags": TUNED_WORKER_FLAGS,
                "round_loads": r["load"],
            },
        )
    if len(rounds) > 1:
        summary = {
            k: statistics.median([r[k] for r in rounds if r.get(k)])
            for k in (
                "notify_queue_per_second",
                "notify_queue_relay_off_per_second",
                "pgboss_per_second",
                "procrastinate_per_second",
                "river_per_second",
                "ratio_pgboss",
                "ratio_procrastinate",
                "ratio_river",
                "ratio_pgboss_relay_off",
                "ratio_procrastinate_relay_off",
                "ratio_river_relay_off",
            )
            if any(r.get(k) for r in rounds)
        }
        ctx.record(
            "peers",
            f"median of {len(rounds)} rounds W={workers}",
            summary,
            load={"loadavg_before": None},
            params={"rounds": len(rounds)},
        )
