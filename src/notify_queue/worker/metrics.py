"""The worker's Prometheus metrics (CONTRACT section 7), served on --metrics-port."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

DELIVERIES = Counter(
    "notify_queue_deliveries",
    "Delivery attempts by channel and outcome.",
    ["channel", "outcome"],
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
