"""What the operator keeps per object does not grow with the objects it has seen: kopf's
per-object memory, the diff-bases and the handlers' progress (operator/storage.py) hold entries
for objects that can still change, never for finished or deleted ones
(`notify_queue_operator_objects_remembered{store}`, docs/operator.md)."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from notify_queue.repositories.db import Database
from tests.operator.conftest import StartOperator
from tests.operator.support import Kube, notification, phase, policy, running_worker, settings_for
from tests.support import eventually

pytestmark = pytest.mark.kubernetes

COUNT = 30
STORES = ("kopf", "diffbase", "progress")


def remembered() -> dict[str, float]:
    return {
        store: REGISTRY.get_sample_value(
            "notify_queue_operator_objects_remembered", {"store": store}
        )
        or 0.0
        for store in STORES
    }


async def test_deleted_notifications_leave_nothing_behind(
    kube: Kube, namespace: str, start_operator: StartOperator, db: Database, database_url: str
) -> None:
    await kube.create(policy(namespace, ttlSecondsAfterFinished=0))
    await start_operator()
    async with running_worker(settings_for(database_url, namespace), db):
        for i in range(COUNT):
            await kube.create(notification(namespace, f"gone-{i}"))

        async def all_deleted() -> bool:
            return not await kube.list("Notification", namespace)

        await eventually(all_deleted, timeout=120, interval=0.5, what="all deleted")

    async def only_the_policy() -> bool:
        return remembered() == {"kopf": 1.0, "diffbase": 1.0, "progress": 0.0}

    await eventually(only_the_policy, timeout=30, interval=0.5, what="only the policy remembered")


async def test_sent_notifications_that_stay_leave_nothing_behind(
    kube: Kube, namespace: str, start_operator: StartOperator, db: Database, database_url: str
) -> None:
    await start_operator()
    async with running_worker(settings_for(database_url, namespace), db):
        for i in range(COUNT):
            await kube.create(notification(namespace, f"kept-{i}"))

        async def all_sent() -> bool:
            objects = await kube.list("Notification", namespace)
            return sum(1 for o in objects if phase(o) == "Sent") == COUNT

        await eventually(all_sent, timeout=120, interval=0.5, what="all Sent")

    async def settled() -> bool:
        return remembered() == {"kopf": 0.0, "diffbase": 0.0, "progress": 0.0}

    await eventually(settled, timeout=30, interval=0.5, what="nothing kept for Sent objects")
