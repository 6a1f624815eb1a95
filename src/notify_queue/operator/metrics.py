"""The operator's own Prometheus metrics, served on --metrics-port.

Queue-wide figures (depth, counts per status) are the API's /metrics; these say how the operator
itself is doing: is the write-back keeping up, what did mirroring come to, what did it scale.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

STATUS_PATCHES = Counter(
    "notify_queue_operator_status_patches",
    "Status write-backs to Notification objects, by outcome (patched, gone: the object was "
    "deleted, failed: will be retried).",
    ["outcome"],
)
MIRRORS = Counter(
    "notify_queue_operator_mirrors",
    "Objects mirrored into the queue, by kind (notification, policy, template) and outcome "
    "(accepted, existing, rejected, conflict, ready, not_ready).",
    ["kind", "outcome"],
)
OBJECTS_REMEMBERED = Gauge(
    "notify_queue_operator_objects_remembered",
    "Entries the operator keeps per object, by store: kopf's per-object memory (objects present "
    "in scope), diff-bases (objects that may still change: policies, templates, unfinished "
    "notifications) and handler progress (handlers running or waiting for a retry).",
    ["store"],
)
SCALE_CHANGES = Counter(
    "notify_queue_operator_scale_changes",
    "Replica count changes of worker pools, by direction (up, down).",
    ["direction"],
)
LANE_DEPTH = Gauge(
    "notify_queue_operator_lane_depth",
    "Notifications PENDING, due now and not expired, per lane (priority, channel): what a worker "
    "of the lane could claim now. For an HPA (external metrics) or KEDA's prometheus scaler.",
    ["priority", "channel"],
)
LANE_OLDEST_DUE_AGE = Gauge(
    "notify_queue_operator_lane_oldest_due_age_seconds",
    "How long the oldest due notification of the lane (priority, channel) has waited (0: none).",
    ["priority", "channel"],
)
WORKER_POOLS = Gauge(
    "notify_queue_operator_worker_pools",
    "Worker pools by who sets their replicas: the operator, or an autoscaler (an HPA or KEDA "
    "ScaledObject targets the Deployment, so the operator leaves it alone).",
    ["scaled_by"],
)
TTL_DELETIONS = Counter(
    "notify_queue_operator_ttl_deletions",
    "Finished Notification objects deleted after their policy's ttlSecondsAfterFinished.",
)
OUTBOX_QUEUED = Gauge(
    "notify_queue_operator_status_outbox_queued",
    "Status changes in the outbox not yet written back to their objects.",
)
OUTBOX_LAG = Gauge(
    "notify_queue_operator_status_outbox_lag_seconds",
    "Age of the oldest status change not yet written back (0: none waiting).",
)

# Every series from the start (at zero), so dashboards and alerts see them before the first event.
for _outcome in ("patched", "gone", "failed"):
    STATUS_PATCHES.labels(_outcome)
for _kind, _outcome in [
    ("notification", "accepted"),
    ("notification", "existing"),
    ("notification", "rejected"),
    ("notification", "conflict"),
    ("policy", "ready"),
    ("policy", "not_ready"),
    ("template", "ready"),
    ("template", "not_ready"),
]:
    MIRRORS.labels(_kind, _outcome)
for _scaled_by in ("operator", "autoscaler"):
    WORKER_POOLS.labels(_scaled_by)
for _direction in ("up", "down"):
    SCALE_CHANGES.labels(_direction)
