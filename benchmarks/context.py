"""What every scenario gets: the sizes of this mode, the database server, the receiver, a place
for logs, and `record()` for its figures (each stored with the load it was measured under)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.env import BenchPostgres, LoadWatch
from benchmarks.procs import Receiver

# The worker flags of the "tuned" runs: with a provider that answers at once, a claim is sized by
# free concurrency, so --concurrency 32 (the default when these were measured; 256 now) caps every
# claim at 32 rows; 500 lets one statement serve 500 (the defaults are measured too).
TUNED_WORKER_FLAGS = ["--concurrency", "500", "--batch-size", "500"]


@dataclass
class Sizes:
    """How big each scenario is in this mode (full, --quick, --smoke)."""

    notifications: int
    workers: list[int]
    failure_workers: int
    rounds: int
    ingest_single: int
    ingest_batches: int
    latency_rate: float
    latency_seconds: float
    scheduled: int
    scale_history: list[int]
    scale_pending: int
    rate_limit_notifications: int
    priority_low: int
    priority_high_rate: float
    peer_notifications: int
    procrastinate_notifications: int
    provider_limit_notifications: int
    provider_limit_per_second: float
    relay_events: int
    # The cost scenario (issue 20): notifications through the API (in batches, and again as
    # single creates) and jobs per peer, how long an idle worker is watched.
    cost_notifications: int
    cost_idle_seconds: float
    # How many times ours (not analysed and analysed), River and pg-boss run one after another:
    # each ratio is taken within a round (neighbours in time share the host's noise) and the
    # verdict is the median of the rounds' ratios.
    cost_rounds: int
    # The citus scenario (issue 21): notifications through the API per engine, on the local
    # cluster (a few minutes for both legs at the full size on 2 cores).
    citus_notifications: int


FULL = Sizes(
    notifications=100_000,
    workers=[1, 2, 4],
    failure_workers=2,
    rounds=2,
    ingest_single=10_000,
    ingest_batches=100,
    latency_rate=500,
    latency_seconds=30,
    scheduled=500,
    scale_history=[0, 1_000_000, 10_000_000],
    scale_pending=30_000,
    rate_limit_notifications=20_000,
    priority_low=100_000,
    priority_high_rate=50,
    peer_notifications=100_000,
    procrastinate_notifications=10_000,
    provider_limit_notifications=100_000,
    provider_limit_per_second=1000,
    relay_events=50_000,
    cost_notifications=20_000,
    cost_idle_seconds=60.0,
    # Five: the CPU ratio moves by ±0.2 between rounds on a shared host, and the verdicts read a
    # gap of 5-10% from the median.
    cost_rounds=5,
    citus_notifications=5_000,
)
QUICK = Sizes(
    notifications=20_000,
    workers=[2],
    failure_workers=2,
    rounds=1,
    ingest_single=5_000,
    ingest_batches=20,
    latency_rate=500,
    latency_seconds=10,
    scheduled=200,
    scale_history=[0, 100_000, 1_000_000],
    scale_pending=10_000,
    rate_limit_notifications=5_000,
    priority_low=20_000,
    priority_high_rate=50,
    peer_notifications=20_000,
    procrastinate_notifications=5_000,
    provider_limit_notifications=20_000,
    provider_limit_per_second=1000,
    relay_events=20_000,
    cost_notifications=5_000,
    cost_idle_seconds=20.0,
    cost_rounds=3,
    citus_notifications=2_000,
)
SMOKE = Sizes(
    notifications=300,
    workers=[1],
    failure_workers=1,
    rounds=1,
    ingest_single=100,
    ingest_batches=1,
    latency_rate=50,
    latency_seconds=1,
    scheduled=5,
    scale_history=[0, 1_000],
    scale_pending=300,
    rate_limit_notifications=200,
    priority_low=300,
    priority_high_rate=20,
    peer_notifications=300,
    procrastinate_notifications=100,
    provider_limit_notifications=300,
    provider_limit_per_second=200,
    relay_events=300,
    cost_notifications=300,
    cost_idle_seconds=2.0,
    cost_rounds=1,
    citus_notifications=200,
)


@dataclass
class Context:
    mode: str
    sizes: Sizes
    pg: BenchPostgres
    workdir: Path
    receiver: Receiver
    worker_args: list[str]
    results: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def logdir(self) -> Path:
        path = self.workdir / "logs"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def record(
        self,
        scenario: str,
        name: str,
        metrics: dict[str, Any],
        *,
        load: LoadWatch | dict[str, Any],
        params: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        entry = {
            "scenario": scenario,
            "name": name,
            "params": params or {},
            "metrics": metrics,
            "load": load.finish() if isinstance(load, LoadWatch) else load,
        }
        self.results.append(entry)
        return entry
