"""What the operator writes to the kube-apiserver per Notification, as the API server itself counts
it (`apiserver_request_total` on its /metrics): on the happy path (applied, mirrored, sent) one
status patch per object and nothing else: no finalizer, no kopf bookkeeping on the object, the
Pending status of a notification sent within the writer's coalescing pause never written
(docs/operator.md "Writes per notification").

The control plane is the session's: the difference of two readings is this test's, since the
operators of earlier tests are stopped and the API server's own writes are to other resources.
"""

from __future__ import annotations

import asyncio

import pytest

from notify_queue.devcluster import LocalControlPlane
from notify_queue.repositories.db import Database
from tests.operator.conftest import StartOperator
from tests.operator.support import Kube, notification, phase, running_worker, settings_for
from tests.support import eventually

pytestmark = pytest.mark.kubernetes

COUNT = 40
WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE", "APPLY")


def notification_writes(
    before: dict[tuple[str, str, str], int], after: dict[tuple[str, str, str], int]
) -> dict[tuple[str, str], int]:
    """Writes to Notification objects between two readings, by (verb, subresource)."""
    return {
        (verb, subresource): count - before.get((verb, resource, subresource), 0)
        for (verb, resource, subresource), count in after.items()
        if resource == "notifications"
        and verb in WRITE_VERBS
        and count > before.get((verb, resource, subresource), 0)
    }


async def test_a_sent_notification_costs_the_operator_one_status_patch_and_nothing_else(
    kube: Kube,
    namespace: str,
    start_operator: StartOperator,
    control_plane: LocalControlPlane,
    db: Database,
    database_url: str,
) -> None:
    # A coalescing pause long enough for every notification of the test to be sent within it
    # (a deadline, not a speed claim): each object's first status is then its final one.
    await start_operator(status_coalesce_seconds=20.0)
    before = await asyncio.to_thread(control_plane.request_counts)
    async with running_worker(settings_for(database_url, namespace), db):
        for i in range(COUNT):
            await kube.create(notification(namespace, f"w-{i}"))

        async def all_sent() -> bool:
            objects = await kube.list("Notification", namespace)
            return sum(1 for o in objects if phase(o) == "Sent") == COUNT

        await eventually(all_sent, timeout=120, interval=0.5, what="all Sent")
    after = await asyncio.to_thread(control_plane.request_counts)

    writes = notification_writes(before, after)
    assert writes.pop(("POST", ""), 0) == COUNT  # the test's own creates
    # Per object: one status patch; never a patch of the object itself (finalizer, annotations).
    assert writes == {("PATCH", "status"): COUNT}
    for obj in await kube.list("Notification", namespace):
        meta = obj["metadata"]
        assert not meta.get("finalizers")
        assert not [a for a in meta.get("annotations") or {} if a.startswith("notifyqueue.io/")]
