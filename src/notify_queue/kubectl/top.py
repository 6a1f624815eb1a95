"""`kubectl notify top`: the queue now, per lane, and the worker pools that drain it.

Depth per lane (PENDING and due now, per priority) and the oldest due age come from the API's
`/status`; the counts of notifications waiting per reason from the gauge `notify_queue_waiting`
on its `/metrics`, when the API exports it; the oldest due per lane from its gauge
`notify_queue_queue_oldest_due_age_seconds{priority}`; worker pools are the Deployments
labelled `notifyqueue.io/worker-pool` (the chart makes them, the operator scales them) with
their replicas and the scaling annotations the operator reads.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from notify_queue.kubectl.api import ApiChoice, ApiUnavailable, NotifyApi
from notify_queue.kubectl.cluster import Cluster, KubeRequestFailed
from notify_queue.kubectl.output import NONE, duration, relative, table

POOL_LABEL = "notifyqueue.io/worker-pool"
LANES = ("HIGH", "NORMAL", "LOW")
SCALING = {
    "priorities": "notifyqueue.io/priorities",
    "channels": "notifyqueue.io/channels",
    "minReplicas": "notifyqueue.io/min-replicas",
    "maxReplicas": "notifyqueue.io/max-replicas",
    "targetDepthPerReplica": "notifyqueue.io/target-depth-per-replica",
}


def waiting_counts(metrics_text: str) -> dict[str, float] | None:
    """`notify_queue_waiting{reason}` from the API's /metrics; None when it is not exported."""
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "notify_queue_waiting":
            return {
                s.labels.get("reason", ""): s.value
                for s in family.samples
                if s.name == "notify_queue_waiting"
            }
    return None


def lane_oldest_due(metrics_text: str) -> dict[str, float] | None:
    """Seconds the oldest due notification of each lane has waited, from the API's gauge
    `notify_queue_queue_oldest_due_age_seconds{priority}`; None when it is not exported."""
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "notify_queue_queue_oldest_due_age_seconds":
            return {
                s.labels.get("priority", ""): s.value
                for s in family.samples
                if s.name == family.name
            }
    return None


def worker_pools(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    deployments = cluster.list(
        f"/apis/apps/v1/namespaces/{namespace}/deployments",
        label_selector=POOL_LABEL,
        what="deployments",
    )
    pools = []
    for d in sorted(deployments, key=lambda d: d["metadata"]["name"]):
        annotations = d["metadata"].get("annotations") or {}
        status = d.get("status") or {}
        pools.append(
            {
                "pool": d["metadata"]["labels"].get(POOL_LABEL) or d["metadata"]["name"],
                "deployment": d["metadata"]["name"],
                "namespace": namespace,
                "replicas": (d.get("spec") or {}).get("replicas", 1),
                "readyReplicas": status.get("readyReplicas", 0),
                **{key: annotations.get(name) for key, name in SCALING.items()},
            }
        )
    return pools


def build_report(
    cluster: Cluster, namespace: str, choice: ApiChoice, timeout_seconds: float = 30.0
) -> dict[str, Any]:
    report: dict[str, Any] = {"api": "ok", "status": None, "waiting": None, "oldestDue": None}
    pools_namespace = namespace
    try:
        api = NotifyApi.connect(cluster, namespace, choice, timeout_seconds=timeout_seconds)
        if api.service is None:
            report["apiUrl"] = api.url
        else:
            pools_namespace = api.service.namespace
            report["apiService"] = f"{api.service.namespace}/{api.service.name}"
        report["status"] = api.get("/status")
        metrics = api.get("/metrics")
        text = metrics if isinstance(metrics, str) else ""
        report["waiting"] = waiting_counts(text)
        report["oldestDue"] = lane_oldest_due(text)
    except ApiUnavailable as exc:
        report["api"] = str(exc)
    try:
        report["pools"] = worker_pools(cluster, pools_namespace)
        report["poolsNamespace"] = pools_namespace
    except KubeRequestFailed as exc:
        report["pools"] = None
        report["poolsNote"] = str(exc)
    return report


def render(report: dict[str, Any]) -> str:
    parts = []
    status = report.get("status")
    if status is None:
        parts.append(f"Queue: unavailable: {report['api']}")
    else:
        due = status.get("due") or {}
        oldest = status.get("oldestDueAgeSeconds") or 0
        lanes = report.get("oldestDue")
        if lanes is None:  # an API without the per-lane gauge
            parts.append(table(("LANE", "DUE NOW"), [(lane, due.get(lane, 0)) for lane in LANES]))
        else:
            parts.append(
                table(
                    ("LANE", "DUE NOW", "OLDEST DUE"),
                    [
                        (lane, due.get(lane, 0), duration(lanes[lane]) if lanes.get(lane) else NONE)
                        for lane in LANES
                    ],
                )
            )
        parts.append(f"Oldest due: {duration(oldest) if oldest else NONE}")
        counts = status.get("counts") or {}
        parts.append(
            table(("STATUS", "COUNT"), [(k, v) for k, v in counts.items() if v] or [("(none)", 0)])
        )
        if report.get("waiting") is None:
            parts.append("Waiting reasons: not exported by this API version")
        else:
            reasons = [(r, int(n)) for r, n in sorted(report["waiting"].items()) if n]
            parts.append(table(("WAITING REASON", "COUNT"), reasons or [("(none)", 0)]))
        providers = status.get("providers") or {}
        if providers:
            circuits = [
                (name, p.get("circuit"), relative(p.get("openUntil")))
                for name, p in sorted(providers.items())
            ]
            parts.append(table(("PROVIDER", "CIRCUIT", "OPEN UNTIL"), circuits))
    if report.get("pools") is None:
        parts.append(f"Worker pools: unavailable: {report.get('poolsNote')}")
    elif not report["pools"]:
        parts.append(f"Worker pools: none in namespace {report['poolsNamespace']}")
    else:
        rows = [
            (
                p["pool"],
                p["deployment"],
                p["priorities"] or "all",
                p["channels"] or "all",
                f"{p['readyReplicas']}/{p['replicas']}",
                p["minReplicas"] or 1,
                p["maxReplicas"] or 10,
            )
            for p in report["pools"]
        ]
        parts.append(
            table(("POOL", "DEPLOYMENT", "PRIORITIES", "CHANNELS", "READY", "MIN", "MAX"), rows)
        )
    return "\n\n".join(parts)
