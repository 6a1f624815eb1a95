"""Scaling that coexists with the autoscalers users bring, on a real kube-apiserver: a pool that
an HorizontalPodAutoscaler or a KEDA ScaledObject (a minimal CRD installed here; without it the
operator carries on) targets keeps the replicas the autoscaler gave it, with an Event saying
so, while the operator still scales the other pools; a pool's depth counts only its priorities
by its channels and never expired rows; the per-lane metrics; and the SQL query of
examples/gitops/keda-scaledobject.yaml, run on a real PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from prometheus_client import REGISTRY

from notify_queue.devcluster import LocalControlPlane
from notify_queue.models import Channel, Priority
from notify_queue.repositories.db import Database
from notify_queue.repositories.kube import KubeRepository
from tests.operator.conftest import StartOperator
from tests.operator.support import Kube
from tests.operator.test_worker_scaling import _deployment, _has_replicas, _replicas
from tests.support import eventually, new, notification_service

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.kubernetes
KEDA_EXAMPLE = ROOT / "examples" / "gitops" / "keda-scaledobject.yaml"

# Just enough of KEDA's CRD for the API server to store ScaledObjects.
SCALED_OBJECT_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "scaledobjects.keda.sh"},
    "spec": {
        "group": "keda.sh",
        "names": {"kind": "ScaledObject", "plural": "scaledobjects", "singular": "scaledobject"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


def _apply(control_plane: LocalControlPlane, obj: dict[str, Any], namespace: str = "") -> None:
    args = ["apply", "-f", "-"] + (["-n", namespace] if namespace else [])
    control_plane.kubectl(*args, input=json.dumps(obj))


async def _said(kube: Kube, namespace: str, name: str, reason: str, text: str) -> bool:
    events = await kube.events(namespace, name=name)
    return any(e["reason"] == reason and text in e["message"] for e in events)


async def test_pools_an_hpa_or_scaled_object_targets_keep_their_replicas(
    kube: Kube,
    namespace: str,
    start_operator: StartOperator,
    control_plane: LocalControlPlane,
) -> None:
    # Three pools at 3 replicas with nothing to do and no scale-down delay: the operator would
    # bring each to 1 at its first round.
    for name in ("own", "hpa-owned", "notify-queue-worker-bulk"):
        await kube.create(_deployment(namespace, name, 3, scale_down_delay="0"))
    _apply(
        control_plane,
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "hpa-owned"},
            "spec": {
                "scaleTargetRef": {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": "hpa-owned",
                },
                "minReplicas": 3,
                "maxReplicas": 5,
                "metrics": [
                    {
                        "type": "Resource",
                        "resource": {
                            "name": "cpu",
                            "target": {"type": "Utilization", "averageUtilization": 80},
                        },
                    }
                ],
            },
        },
        namespace,
    )
    control_plane.kubectl("delete", "crd", "scaledobjects.keda.sh", "--ignore-not-found")
    await start_operator(scale_interval=0.2)

    # Without KEDA's CRD the operator carries on: it scales its own pools...
    await eventually(lambda: _has_replicas(kube, namespace, "own", 1), timeout=10)
    await eventually(
        lambda: _has_replicas(kube, namespace, "notify-queue-worker-bulk", 1), timeout=10
    )
    # ...and leaves the HPA's alone, saying so (in the round that decided it).
    await eventually(
        lambda: _said(
            kube, namespace, "hpa-owned", "ScaledExternally", "HorizontalPodAutoscaler/hpa-owned"
        ),
        timeout=10,
    )
    assert await _replicas(kube, namespace, "hpa-owned") == 3

    # KEDA arrives; the example ScaledObject targets the bulk pool, which an autoscaler (KEDA's
    # HPA, absent here) has put at 4.
    _apply(control_plane, SCALED_OBJECT_CRD)
    control_plane.kubectl(
        "wait", "--for=condition=Established", "crd/scaledobjects.keda.sh", "--timeout=30s"
    )
    try:
        scaled_object = next(
            d for d in yaml.safe_load_all(KEDA_EXAMPLE.read_text()) if d["kind"] == "ScaledObject"
        )
        _apply(control_plane, scaled_object, namespace)
        await kube.patch(
            "Deployment",
            namespace,
            "notify-queue-worker-bulk",
            {"spec": {"replicas": 4}},
            subresource="scale",
        )
        await eventually(
            lambda: _said(
                kube,
                namespace,
                "notify-queue-worker-bulk",
                "ScaledExternally",
                "ScaledObject/notify-queue-worker-bulk",
            ),
            timeout=10,
        )
        assert await _replicas(kube, namespace, "notify-queue-worker-bulk") == 4
        assert await _replicas(kube, namespace, "hpa-owned") == 3
        assert (
            REGISTRY.get_sample_value(
                "notify_queue_operator_worker_pools", {"scaled_by": "autoscaler"}
            )
            == 2
        )
        # The user removes the HPA: the pool is the operator's again.
        control_plane.kubectl("delete", "hpa", "hpa-owned", "-n", namespace)
        await eventually(lambda: _has_replicas(kube, namespace, "hpa-owned", 1), timeout=10)
    finally:
        control_plane.kubectl("delete", "crd", "scaledobjects.keda.sh", "--ignore-not-found")


async def test_a_pool_counts_its_priorities_by_its_channels_and_never_expired_rows(
    kube: Kube, namespace: str, start_operator: StartOperator, db: Database
) -> None:
    await kube.create(
        _deployment(
            namespace,
            "email-low",
            1,
            priorities="LOW",
            channels="email",
            target_depth_per_replica="2",
            max_replicas="10",
        )
    )
    notifications = notification_service(db)
    for _ in range(5):  # 5 due LOW emails: ceil(5 / 2) = 3
        await notifications.enqueue(new(priority=Priority.LOW))
    for _ in range(6):  # other lanes: not this pool's
        await notifications.enqueue(new(priority=Priority.LOW, channel=Channel.SMS))
        await notifications.enqueue(new(priority=Priority.HIGH))
    past = datetime.now(UTC) - timedelta(seconds=1)
    for _ in range(8):  # expired, not yet marked so (no worker runs here): never counted
        await notifications.enqueue(new(priority=Priority.LOW, expires_at=past))
    await start_operator(scale_interval=0.2)

    await eventually(lambda: _has_replicas(kube, namespace, "email-low", 3), timeout=10)

    def gauge(priority: str, channel: str) -> float | None:
        return REGISTRY.get_sample_value(
            "notify_queue_operator_lane_depth", {"priority": priority, "channel": channel}
        )

    assert (gauge("LOW", "email"), gauge("LOW", "sms"), gauge("HIGH", "email")) == (5, 6, 6)
    assert gauge("NORMAL", "push") == 0
    age = REGISTRY.get_sample_value(
        "notify_queue_operator_lane_oldest_due_age_seconds", {"priority": "LOW", "channel": "sms"}
    )
    assert age is not None and age > 0


def _keda_query() -> str:
    scaled_object = next(
        d for d in yaml.safe_load_all(KEDA_EXAMPLE.read_text()) if d["kind"] == "ScaledObject"
    )
    (trigger,) = scaled_object["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    return str(trigger["metadata"]["query"])


async def test_the_keda_example_query_counts_what_the_bulk_pool_could_claim(
    db: Database, database_url: str
) -> None:
    notifications = notification_service(db)
    for priority, channel, count in [
        (Priority.NORMAL, Channel.EMAIL, 4),
        (Priority.LOW, Channel.PUSH, 3),
        (Priority.LOW, Channel.VOICE, 2),  # the bulk pool serves every channel
        (Priority.HIGH, Channel.SMS, 5),  # the urgent pool's lane: not counted
    ]:
        for _ in range(count):
            await notifications.enqueue(new(priority=priority, channel=channel))
    await notifications.enqueue(new(priority=Priority.LOW, delay_seconds=3600))  # not due
    past = datetime.now(UTC) - timedelta(seconds=1)
    await notifications.enqueue(new(priority=Priority.LOW, expires_at=past))  # expired

    # As KEDA runs it: the query text alone, on a connection of its own.
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cursor = await conn.execute(_keda_query().encode())
        ((count,),) = await cursor.fetchall()
    assert count == 9
    lanes = await KubeRepository(db).lane_depths()
    bulk = sum(
        lane.depth for (p, _c), lane in lanes.items() if p in (Priority.NORMAL, Priority.LOW)
    )
    assert bulk == count
