"""The database pool as Prometheus metrics, for every role that serves /metrics.

A collector rather than gauges set by a loop: the pool keeps its own counts (psycopg_pool's
`get_stats()`, read through `Database.pool_stats`), so a scrape reads them at that moment and
nothing runs between scrapes. The figures are this process's own (unlike the API's queue
figures, which are the database's), so dashboards sum or compare them across pods. One class
for the API and the worker, which may not import each other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from notify_queue.models import PoolStats


class PoolCollector(Collector):
    """Reads `stats()` at each scrape; `stats` None (the pool is not open yet): nothing."""

    def __init__(self, stats: Callable[[], PoolStats] | None = None) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        if self.stats is None:
            return
        s = self.stats()
        connections = GaugeMetricFamily(
            "notify_queue_database_pool_connections",
            "Connections this process's pool holds now, by state (in_use, idle).",
            labels=["state"],
        )
        connections.add_metric(["in_use"], max(s.connections - s.idle, 0))
        connections.add_metric(["idle"], s.idle)
        yield connections
        yield GaugeMetricFamily(
            "notify_queue_database_pool_max_connections",
            "The pool's size limit (--database-pool-size).",
            value=s.max_connections,
        )
        yield GaugeMetricFamily(
            "notify_queue_database_pool_waiting",
            "Callers waiting for a connection now (above 0 for long: the pool is too small).",
            value=s.waiting,
        )
        # CounterMetricFamily appends `_total` to these names.
        yield CounterMetricFamily(
            "notify_queue_database_pool_acquires",
            "Connections handed out by the pool.",
            value=s.acquires_total,
        )
        yield CounterMetricFamily(
            "notify_queue_database_pool_acquire_wait_seconds",
            "Seconds callers spent waiting for a connection, summed.",
            value=s.acquire_wait_seconds_total,
        )
        yield CounterMetricFamily(
            "notify_queue_database_pool_acquire_errors",
            "Requests for a connection that timed out (the call failed as DatabaseUnavailable).",
            value=s.acquire_errors_total,
        )
        yield CounterMetricFamily(
            "notify_queue_database_pool_connections_lost",
            "Pooled connections found broken and replaced (a database restart shows here).",
            value=s.connections_lost_total,
        )
