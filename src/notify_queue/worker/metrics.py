"""The worker's Prometheus metrics (docs/operations.md, "What to watch"), served on --metrics-port.

The three that every delivery adds to (`DELIVERIES`, `DELIVERY_DURATION`, `DUE_TO_SENT`) are
`LoopCounter` and `LoopHistogram`: plain numbers, where prometheus_client's own types take a lock
per increment and, per observation, two and a walk along the buckets in Python, a measurable share
of a worker's CPU at three per delivery (docs/performance.md). They are
written on the worker's event loop only, and read on it too: /metrics is served on the same loop
(worker/endpoints.py), so a scrape never sees a number half-written. Their exposition is
prometheus_client's, line for line (tests/test_worker_metrics.py compares the two).
"""

from __future__ import annotations

import itertools
import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import REGISTRY, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from notify_queue.services.pool_metrics import PoolCollector


class _CounterSeries:
    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class _HistogramSeries:
    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        self.sum += amount
        # The first bucket whose bound is >= amount: Prometheus buckets are "le".
        self.counts[bisect_left(self.bounds, amount)] += 1


class LoopCounter(Collector):
    """A labelled counter written on the event loop only (module docstring)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        self._name, self._documentation, self._labelnames = name, documentation, list(labelnames)
        self._series: dict[tuple[str, ...], _CounterSeries] = {}
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> _CounterSeries:
        series = self._series.get(values)
        if series is None:
            series = self._series[values] = _CounterSeries()
        return series

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self._name, self._documentation, labels=self._labelnames)
        for values, series in list(self._series.items()):
            family.add_metric(values, series.value, created=series.created)
        yield family


class LoopHistogram(Collector):
    """A labelled histogram written on the event loop only (module docstring)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        self._name, self._documentation, self._labelnames = name, documentation, list(labelnames)
        self._bounds = tuple(float(b) for b in buckets)
        # prometheus_client's own spelling of a bound ("1.0", "+Inf"); the function is untyped.
        les: list[str] = [floatToGoString(b) for b in self._bounds]  # type: ignore[no-untyped-call]
        self._les = [*les, "+Inf"]
        self._series: dict[tuple[str, ...], _HistogramSeries] = {}
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> _HistogramSeries:
        series = self._series.get(values)
        if series is None:
            series = self._series[values] = _HistogramSeries(self._bounds)
        return series

    def collect(self) -> Iterator[HistogramMetricFamily | GaugeMetricFamily]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)
        # prometheus_client writes a histogram's `_created` as a gauge family of its own after
        # the histogram's (the text format has no place for it inside).
        created = GaugeMetricFamily(
            self._name + "_created", self._documentation, labels=self._labelnames
        )
        for values, series in list(self._series.items()):
            cumulative = itertools.accumulate(list(series.counts))
            buckets = [(le, float(n)) for le, n in zip(self._les, cumulative, strict=True)]
            family.add_metric(list(values), buckets, series.sum)
            created.add_metric(list(values), series.created)
        yield family
        yield created


DELIVERIES = LoopCounter(
    "notify_queue_deliveries",
    "Provider calls and skips by channel, outcome and provider (provider is empty for "
    "rate_limited: the recipient's window, before any provider is chosen).",
    ["channel", "outcome", "provider"],
)
CIRCUIT_STATE = Gauge(
    "notify_queue_provider_circuit_state",
    "Circuit of each provider as this worker last read it: 0 closed, 1 half-open, 2 open.",
    ["provider"],
)
CIRCUIT_TRANSITIONS = Counter(
    "notify_queue_provider_circuit_transitions",
    "Circuit state changes this worker recorded, by provider and new state.",
    ["provider", "state"],
)
DELIVERY_DURATION = LoopHistogram(
    "notify_queue_delivery_duration_seconds",
    "Seconds one provider call took.",
    ["channel"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
STALE_RESULTS = Counter(
    "notify_queue_stale_results",
    "Results dropped because the claim had expired and moved on (a slow worker reported late).",
)
WEBHOOK_POSTS = Counter(
    "notify_queue_webhook_posts",
    "Webhook POSTs by result.",
    ["result"],
)
DUE_TO_SENT = LoopHistogram(
    "notify_queue_due_to_sent_seconds",
    "Seconds from a notification's send time (when it first became due) to the provider's "
    "acceptance: queueing, retries and waits included, what a recipient feels as lateness.",
    ["channel", "priority"],
    # From a sub-second claim to hours of backoff and rate-limit waits.
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400),
)
# This process's database pool; the worker's wiring points it at its pool (worker/main.py).
DATABASE_POOL = PoolCollector()
REGISTRY.register(DATABASE_POOL)
