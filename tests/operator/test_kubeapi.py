"""The operator's own Kubernetes calls (`operator.kubeapi`) against a real kube-apiserver: a status
is written only to the object with the expected uid, a delete likewise, and a status the schema
refuses is reported as refused, not as a vanished object."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from notify_queue.devcluster import LocalControlPlane
from notify_queue.operator.kubeapi import (
    KubeApi,
    KubeRefused,
    PatchOutcome,
    load_kube_configuration,
)
from tests.operator.support import Kube, notification

pytestmark = pytest.mark.kubernetes


@pytest.fixture
async def api(control_plane: LocalControlPlane) -> AsyncIterator[KubeApi]:
    client = KubeApi(load_kube_configuration(control_plane.kubeconfig))
    yield client
    await client.close()


async def test_a_status_is_written_only_to_the_object_with_the_expected_uid(
    api: KubeApi, kube: Kube, namespace: str
) -> None:
    created = await kube.create(notification(namespace, "target"))
    uid = created["metadata"]["uid"]

    other = await api.status_patch(
        plural="notifications",
        namespace=namespace,
        name="target",
        uid="00000000-0000-0000-0000-000000000000",
        status={"phase": "Sent"},
    )
    assert other is PatchOutcome.GONE
    assert "status" not in (await kube.get("Notification", namespace, "target") or {})

    mine = await api.status_patch(
        plural="notifications",
        namespace=namespace,
        name="target",
        uid=uid,
        status={"phase": "Pending", "attempts": 0, "lastError": None},
    )
    assert mine is PatchOutcome.PATCHED
    assert (await kube.get("Notification", namespace, "target") or {})["status"] == {
        "phase": "Pending",
        "attempts": 0,
    }

    missing = await api.status_patch(
        plural="notifications",
        namespace=namespace,
        name="nobody",
        uid=uid,
        status={"phase": "Sent"},
    )
    assert missing is PatchOutcome.GONE

    with pytest.raises(KubeRefused, match=r"status\.phase"):
        await api.status_patch(
            plural="notifications",
            namespace=namespace,
            name="target",
            uid=uid,
            status={"phase": "Delivered-ish"},
        )


async def test_a_delete_spares_a_newer_object_with_the_same_name(
    api: KubeApi, kube: Kube, namespace: str
) -> None:
    created = await kube.create(notification(namespace, "reused"))
    assert not await api.custom_object_delete(
        plural="notifications", namespace=namespace, name="reused", uid="not-its-uid"
    )
    assert await kube.get("Notification", namespace, "reused") is not None
    assert await api.custom_object_delete(
        plural="notifications", namespace=namespace, name="reused", uid=created["metadata"]["uid"]
    )
    assert await kube.get("Notification", namespace, "reused") is None
