"""The worker's Prometheus metrics (CONTRACT section 7), served on --metrics-port."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

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
