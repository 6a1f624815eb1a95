"""Worker scaling on a real kube-apiserver: a Deployment labelled notifyqueue.io/worker-pool is
scaled through its scale subresource from the depth of its lanes, up at once and down only after
the scale-down delay. The operator never writes to the Deployment itself (docs/security.md): the
delay is counted in its memory, so a restarted operator waits it out afresh. There are no nodes
here, so no pod ever runs; spec.replicas and the scale subresource are what is checked."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from notify_queue.models import Channel, Priority
from notify_queue.repositories.db import Database
from tests.operator.conftest import StartOperator
from tests.operator.support import Kube
from tests.support import eventually, new, notification_service

pytestmark = pytest.mark.kubernetes


def _deployment(namespace: str, name: str, replicas: int, **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"notifyqueue.io/worker-pool": name},
            "annotations": {
                f"notifyqueue.io/{k.replace('_', '-')}": v for k, v in annotations.items()
            },
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "worker", "image": "notify-queue:test"}]},
            },
        },
    }


async def _replicas(kube: Kube, namespace: str, name: str) -> int:
    deployment = await kube.get("Deployment", namespace, name)
    assert deployment is not None
    return int(deployment["spec"]["replicas"])


async def test_a_pool_scales_up_with_its_lanes_depth_and_down_only_after_the_delay(
    kube: Kube, namespace: str, start_operator: StartOperator, db: Database
) -> None:
    await kube.create(
        _deployment(
            namespace,
            "urgent",
            1,
            priorities="HIGH",
            min_replicas="1",
            max_replicas="4",
            target_depth_per_replica="2",
            scale_down_delay="3",
        )
    )
    await kube.create(_deployment(namespace, "bulk", 1, priorities="LOW", max_replicas="3"))
    notifications = notification_service(db)
    high = [await notifications.enqueue(new(priority=Priority.HIGH)) for _ in range(7)]
    for _ in range(3):
        await notifications.enqueue(new(priority=Priority.LOW, channel=Channel.SMS))
    await start_operator(scale_interval=0.2)

    # ceil(7 / 2) = 4, within max 4; the bulk pool's 3 LOW ones fit one replica of target 100.
    await eventually(lambda: _has_replicas(kube, namespace, "urgent", 4), timeout=10)
    assert await _replicas(kube, namespace, "bulk") == 1
    await eventually(lambda: _scaled_event(kube, namespace, "from 1 to 4"), timeout=5)

    before = await kube.get("Deployment", namespace, "urgent")
    for created in high:
        await notifications.cancel(created.notification.id)
    emptied = time.monotonic()

    await eventually(lambda: _has_replicas(kube, namespace, "urgent", 1), timeout=15)
    assert time.monotonic() - emptied >= 2.8
    # The Event is posted after the scale itself; wait for it rather than read once.
    await eventually(lambda: _scaled_event(kube, namespace, "down from 4 to 1"), timeout=5)
    # Only spec.replicas changed, through the scale subresource: no annotation, no template.
    after = await kube.get("Deployment", namespace, "urgent")
    assert before is not None and after is not None
    assert after["metadata"]["annotations"] == before["metadata"]["annotations"]
    assert after["spec"]["template"] == before["spec"]["template"]


async def _scaled_event(kube: Kube, namespace: str, text: str) -> bool:
    events = await kube.events(namespace, name="urgent")
    return any(e["reason"] == "Scaled" and text in e["message"] for e in events)


async def test_a_restarted_operator_waits_the_scale_down_delay_afresh_and_leaves_annotations(
    kube: Kube, namespace: str, start_operator: StartOperator
) -> None:
    # An older operator kept "fewer wanted since" in this annotation; this one neither reads nor
    # removes it: it counts the 2 s delay from its own first round.
    since = (datetime.now(UTC) - timedelta(seconds=10)).isoformat()
    await kube.create(
        _deployment(namespace, "pool", 3, scale_down_delay="2", scale_down_wanted_since=since)
    )
    started = time.monotonic()
    await start_operator(scale_interval=0.2)

    await eventually(lambda: _has_replicas(kube, namespace, "pool", 1), timeout=10)
    assert time.monotonic() - started >= 2
    deployment = await kube.get("Deployment", namespace, "pool")
    assert deployment is not None
    assert deployment["metadata"]["annotations"]["notifyqueue.io/scale-down-wanted-since"] == since


async def test_bad_scaling_annotations_leave_the_pool_alone_and_say_why(
    kube: Kube, namespace: str, start_operator: StartOperator
) -> None:
    await kube.create(_deployment(namespace, "odd", 2, min_replicas="five", priorities="URGENT"))
    await start_operator(scale_interval=0.2)

    events = await eventually(lambda: kube.events(namespace, name="odd"), timeout=10)
    assert events[0]["reason"] == "InvalidScalingAnnotations"
    assert "notifyqueue.io/min-replicas" in events[0]["message"]
    assert "notifyqueue.io/priorities" in events[0]["message"]
    assert await _replicas(kube, namespace, "odd") == 2


async def _has_replicas(kube: Kube, namespace: str, name: str, expected: int) -> bool:
    return await _replicas(kube, namespace, name) == expected
