"""The worker's figures for the dashboard: the due-to-sent latency histogram, which starts at the
notification's send time (the claim returns it), the database pool collector, and the lock-free
types the delivery path writes (exposed as prometheus_client's own)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from notify_queue.models import Priority, Status
from notify_queue.providers.simulated import SimulatedProvider
from notify_queue.repositories.db import Database
from notify_queue.worker.metrics import DATABASE_POOL, LoopCounter, LoopHistogram
from tests.support import (
    delivery_service,
    eventually,
    new,
    notification_service,
    start_workers,
)

_LABELS = {"channel": "email", "priority": "LOW"}


def _due_to_sent() -> tuple[float, float]:
    count = REGISTRY.get_sample_value("notify_queue_due_to_sent_seconds_count", _LABELS) or 0.0
    total = REGISTRY.get_sample_value("notify_queue_due_to_sent_seconds_sum", _LABELS) or 0.0
    return count, total


async def test_the_claim_returns_when_the_notification_first_became_due(db: Database) -> None:
    send_at = datetime.now(UTC) - timedelta(minutes=5)
    created = await notification_service(db).enqueue(new(send_at=send_at))

    (claimed,) = (await delivery_service(db).claim(10)).claimed

    assert claimed.id == created.notification.id
    assert claimed.due_at is not None
    assert abs((claimed.due_at - send_at).total_seconds()) < 0.001


async def test_a_sent_notification_is_observed_from_its_send_time(
    db: Database, database_url: str
) -> None:
    before_count, before_sum = _due_to_sent()
    notifications = notification_service(db)
    late = await notifications.enqueue(
        new(priority=Priority.LOW, send_at=datetime.now(UTC) - timedelta(seconds=120))
    )
    failing = await notifications.enqueue(
        new(priority=Priority.LOW, recipient="invalid-1@example.com")
    )
    workers = await start_workers(database_url, SimulatedProvider(0.0, 0, 1.0))
    try:

        async def both_final() -> bool:
            states = {(await notifications.get(n.notification.id)).status for n in (late, failing)}
            return states == {Status.SENT, Status.FAILED}

        await eventually(both_final, timeout=30)
    finally:
        await workers.stop()

    count, total = _due_to_sent()
    assert count - before_count == 1  # the failed one is not observed
    assert 120 <= total - before_sum < 3600  # from its send time, two minutes ago


async def test_the_pool_collector_reports_the_pool_it_is_pointed_at(db: Database) -> None:
    previous = DATABASE_POOL.stats
    DATABASE_POOL.stats = db.pool_stats
    try:
        await db.fetch_one("database_now")
        text = generate_latest(REGISTRY).decode()
    finally:
        DATABASE_POOL.stats = previous
    found = {
        (s.name, tuple(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("notify_queue_database_pool_")
    }
    assert found[("notify_queue_database_pool_max_connections", ())] == 20  # the fixture's size
    assert found[("notify_queue_database_pool_acquires_total", ())] >= 1
    in_use = found[("notify_queue_database_pool_connections", (("state", "in_use"),))]
    idle = found[("notify_queue_database_pool_connections", (("state", "idle"),))]
    assert in_use == 0 and idle >= 1  # nothing holds a connection between calls


def _exposition(registry: CollectorRegistry) -> list[str]:
    """The registry's text, each `_created` value (a clock reading) blanked."""
    return [
        re.sub(r"_created(\{.*\})? \S+$", r"_created\1 <time>", line)
        for line in generate_latest(registry).decode().splitlines()
    ]


def test_the_loop_only_metrics_are_exposed_as_prometheus_clients_own() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    labels = ["channel", "outcome"]
    bounds = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 30)
    counters = (
        LoopCounter("nq_test_deliveries", "Deliveries.", labels, registry=ours),
        Counter("nq_test_deliveries", "Deliveries.", labels, registry=theirs),
    )
    histograms = (
        LoopHistogram("nq_test_seconds", "Seconds.", ["channel"], bounds, registry=ours),
        Histogram("nq_test_seconds", "Seconds.", ["channel"], buckets=bounds, registry=theirs),
    )
    # On a bound, between bounds, above all of them, zero: each lands where prometheus_client
    # puts it.
    observed = [0.0, 0.05, 0.07, 0.1, 1, 2.4999, 2.5, 30, 31, 1e9, 0.3]
    for counter in counters:
        counter.labels("email", "sent").inc()
        counter.labels("email", "sent").inc(2)
        counter.labels("sms", "permanent_failure").inc()
    for histogram in histograms:
        for i, seconds in enumerate(observed):
            histogram.labels("email" if i % 3 else "push").observe(seconds)
    assert _exposition(ours) == _exposition(theirs)
