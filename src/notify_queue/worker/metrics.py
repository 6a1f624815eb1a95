"""The worker's Prometheus metrics (CONTRACT section 7), served on --metrics-port."""

from __future__ import annotations

from prometheus_client import REGISTRY, Counter, Gauge, Histogram

from notify_queue.services.pool_metrics import PoolCollector

DELIVERIES = Counter(
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
DELIVERY_DURATION = Histogram(
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
DUE_TO_SENT = Histogram(
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
