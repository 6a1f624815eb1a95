"""The API's `/metrics` (docs/operations.md): global queue figures read from the database.

The figures are the database's, not this process's, so every API replica reports the same
numbers and none is lost on restart. Reading them is seven statements, two of them counts over
every pending row, so a scrape is served a snapshot at most `--metrics-refresh-seconds` old
(`SnapshotCache`): however many scrape at once, one read is in flight. prometheus_client
collectors are synchronous while the database is reached asynchronously, so a scrape first
awaits its snapshot and then renders the registry with it synchronously, without an await in
between: concurrent scrapes on one event loop cannot see each other's snapshot. The registry
is this app's own (never the global default), with the standard process and platform
collectors beside the queue's.

Two kinds of figure are this process's own rather than the database's: the creates it answered,
by outcome (`notify_queue_creates_total`), and its database pool (services/pool_metrics.py).
Dashboards sum those over the API's pods and take max() of the global ones.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from notify_queue.models import RECEIPT_STATES, Channel, PoolStats, QueueStatus
from notify_queue.services.pool_metrics import PoolCollector

_CIRCUIT_CODES = {"closed": 0, "half-open": 1, "open": 2}


class QueueCollector(Collector):
    def __init__(self) -> None:
        self.snapshot: QueueStatus | None = None

    def collect(self) -> Iterator[Metric]:
        status = self.snapshot
        if status is None:
            return
        notifications = GaugeMetricFamily(
            "notify_queue_notifications", "Notifications by current status.", labels=["status"]
        )
        for state, count in status.counts.items():
            notifications.add_metric([state.value], count)
        depth = GaugeMetricFamily(
            "notify_queue_queue_depth",
            "PENDING notifications due now, by priority.",
            labels=["priority"],
        )
        for priority, count in status.due.items():
            depth.add_metric([priority.value], count)
        lane_oldest = GaugeMetricFamily(
            "notify_queue_queue_oldest_due_age_seconds",
            "Seconds the oldest due PENDING notification of each priority has waited (0: none).",
            labels=["priority"],
        )
        for priority, age in status.oldest_due_age_by_priority.items():
            lane_oldest.add_metric([priority.value], age)
        oldest = GaugeMetricFamily(
            "notify_queue_oldest_due_age_seconds",
            "Seconds the oldest due PENDING notification has been waiting (0: none due).",
            value=status.oldest_due_age_seconds,
        )
        hooks = GaugeMetricFamily(
            "notify_queue_webhook_events", "Webhook events by delivery state.", labels=["state"]
        )
        for state_name, count in status.webhook_events.items():
            hooks.add_metric([state_name], count)
        circuits = GaugeMetricFamily(
            "notify_queue_provider_circuit_state",
            "Circuit of each provider with a breaker: 0 closed, 1 half-open, 2 open.",
            labels=["provider"],
        )
        for name, circuit in status.providers.items():
            circuits.add_metric([name], _CIRCUIT_CODES[circuit.state])
        waiting = GaugeMetricFamily(
            "notify_queue_waiting",
            "PENDING notifications not due yet, by the reason they wait (every reason, 0 when "
            "none).",
            labels=["reason"],
        )
        for reason, count in status.waiting.items():
            waiting.add_metric([reason.value], count)
        suppressions = GaugeMetricFamily(
            "notify_queue_suppressions",
            "Addresses on the suppression list, by channel (docs/receipts.md).",
            labels=["channel"],
        )
        for channel, count in ({c.value: 0 for c in Channel} | status.suppressions).items():
            suppressions.add_metric([channel], count)
        yield from (notifications, depth, lane_oldest, oldest, hooks, circuits, waiting)
        yield suppressions


class SnapshotCache:
    """The last `QueueStatus` read, read again when older than `max_age_seconds`: one read at
    a time, shared by every scrape that wants it meanwhile. The read is shielded from a
    scrape's cancellation (a client that hangs up), so the others still get it."""

    def __init__(
        self, read: Callable[[], Awaitable[QueueStatus]], *, max_age_seconds: float
    ) -> None:
        self._read = read
        self._max_age_seconds = max_age_seconds
        self._snapshot: QueueStatus | None = None
        self._read_at = 0.0  # monotonic seconds when the snapshot's read began
        self._reading: asyncio.Task[QueueStatus] | None = None

    async def get(self) -> QueueStatus:
        fresh = time.monotonic() - self._read_at < self._max_age_seconds
        if self._snapshot is not None and fresh:
            return self._snapshot
        if self._reading is None:
            self._reading = asyncio.create_task(self._refresh())
            # Retrieved here too, so a failed read nobody waits for any more is not reported
            # as "never retrieved" (each waiting scrape gets the error itself).
            self._reading.add_done_callback(lambda t: t.cancelled() or t.exception())
        return await asyncio.shield(self._reading)

    async def _refresh(self) -> QueueStatus:
        started = time.monotonic()
        try:
            self._snapshot = await self._read()
            self._read_at = started
            return self._snapshot
        finally:
            self._reading = None


# What a create (one `POST /notifications`, or one item of a batch) came to.
CREATE_OUTCOMES = ("created", "existing", "conflict", "invalid")


class QueueMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._queue = QueueCollector()
        self.registry.register(self._queue)
        self._pool = PoolCollector()
        self.registry.register(self._pool)
        creates = Counter(
            "notify_queue_creates",
            "Creates this API process answered (each item of a batch counts), by outcome: "
            "created (201), existing (200, the same key and request again), conflict (409), "
            "invalid (400).",
            ["outcome"],
            registry=self.registry,
        )
        # Every series from the start, so a rate() is 0 rather than absent before the first.
        self.creates = {outcome: creates.labels(outcome) for outcome in CREATE_OUTCOMES}
        # Receipts this API process recorded, by provider and what they said; `unknown`: the
        # provider message id names no notification sent here (docs/receipts.md).
        self.receipts = Counter(
            "notify_queue_delivery_receipts",
            "Verified delivery receipts by provider and state (delivered, bounced, complained, "
            "unknown: no notification sent here has that provider message id).",
            ["provider", "state"],
            registry=self.registry,
        )
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)

    def watch_receipts(self, providers: Iterable[str]) -> None:
        """Every series of these providers' receipts from the start (0, not absent)."""
        for provider in providers:
            for state in (*RECEIPT_STATES, "unknown"):
                self.receipts.labels(provider, state)

    def watch_pool(self, stats: Callable[[], PoolStats]) -> None:
        """Report this pool's figures from now on (the app's lifespan opens the pool)."""
        self._pool.stats = stats

    def render(self, status: QueueStatus, *, accept: str | None) -> tuple[bytes, str]:
        """The exposition of this snapshot in the format `accept` asks for (Prometheus text
        0.0.4 by default, OpenMetrics on request), and its media type. Synchronous: see above."""
        encoder, media_type = choose_encoder(accept or "")
        self._queue.snapshot = status
        try:
            return encoder(self.registry), media_type
        finally:
            self._queue.snapshot = None
