"""A Notification's life on a real kube-apiserver, with a real operator, worker and PostgreSQL:
applied, mirrored into one row, delivered, its status written back; rejected by the operator
when the queue refuses it; cancelled when deleted while Pending; shown by `kubectl get notif`."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from notify_queue.devcluster import LocalControlPlane
from notify_queue.repositories.db import Database
from notify_queue.repositories.notifications import NotificationRepository
from tests.operator.conftest import StartOperator
from tests.operator.support import (
    Kube,
    OperatorThread,
    condition,
    notification,
    phase,
    running_worker,
    settings_for,
)
from tests.support import eventually

pytestmark = pytest.mark.kubernetes


async def _row(db: Database, key: str) -> dict[str, object] | None:
    rows = await db.fetch_all("notification_get_by_keys", {"idempotency_keys": [key]})
    return rows[0] if rows else None


async def test_an_applied_notification_is_sent_and_its_status_says_so(
    kube: Kube,
    namespace: str,
    operator: OperatorThread,
    database_url: str,
    db: Database,
    control_plane: LocalControlPlane,
) -> None:
    created = await kube.create(notification(namespace, "welcome", subject="Hi", body="Welcome!"))
    uid = created["metadata"]["uid"]

    async def accepted() -> object:
        obj = await kube.get("Notification", namespace, "welcome")
        return phase(obj) == "Pending" and obj

    obj = await eventually(accepted, timeout=15)
    assert condition(obj, "Accepted")["status"] == "True"
    # Due, and no worker runs yet: it waits NoWorker (docs/design.md "Why a notification waits").
    assert condition(obj, "Delivered")["reason"] == "NoWorker"
    row = await _row(db, f"k8s:{uid}")
    assert (
        row is not None
        and row["source"] == "kubernetes"
        and row["policy"] == f"{namespace}/default"
    )
    assert obj["status"]["notificationId"] == str(row["id"])

    async with running_worker(settings_for(database_url, namespace), db):

        async def sent() -> object:
            obj = await kube.get("Notification", namespace, "welcome")
            return phase(obj) == "Sent" and obj

        obj = await eventually(sent, timeout=15)

    status = obj["status"]
    assert status["attempts"] == 1 and status["sentAt"] and status["observedGeneration"] == 1
    assert status.get("lastError") is None and status.get("nextAttemptAt") is None
    delivered = condition(obj, "Delivered")
    assert delivered["status"] == "True" and delivered["reason"] == "Sent"
    events = await eventually(lambda: kube.events(namespace, name="welcome"))
    assert any(e["reason"] == "Accepted" and str(row["id"]) in e["message"] for e in events)

    listing = control_plane.kubectl("get", "notif", "-n", namespace).stdout.splitlines()
    assert listing[0].split() == [
        "NAME",
        "PHASE",
        "CHANNEL",
        "RECIPIENT",
        "PRIORITY",
        "ATTEMPTS",
        "WAITING",
        "AGE",
    ]
    assert listing[1].split()[:6] == [
        "welcome",
        "Sent",
        "email",
        obj["spec"]["recipient"],
        "NORMAL",
        "1",
    ]


async def test_deleting_a_pending_notification_cancels_it(
    kube: Kube, namespace: str, operator: OperatorThread, db: Database
) -> None:
    created = await kube.create(notification(namespace, "later", delay="1h"))
    key = f"k8s:{created['metadata']['uid']}"
    await eventually(lambda: _is_phase(kube, namespace, "later", "Pending"), timeout=15)
    # No finalizer: the clean-up runs on the DELETED event (docs/operator.md "Deletion").
    obj = await kube.get("Notification", namespace, "later")
    assert not obj["metadata"].get("finalizers")

    await kube.delete("Notification", namespace, "later")

    await eventually(lambda: _gone(kube, namespace, "later"), timeout=10)

    async def cancelled() -> bool:
        row = await _row(db, key)
        return row is not None and row["status"] == "CANCELLED"

    await eventually(cancelled, timeout=10, what="the row CANCELLED after the object went")


async def test_deleting_a_notification_whose_row_is_final_or_missing_is_not_held_up(
    kube: Kube, namespace: str, operator: OperatorThread, db: Database
) -> None:
    final = await kube.create(notification(namespace, "final", delay="1h"))
    missing = await kube.create(notification(namespace, "missing", delay="1h"))
    for name in ("final", "missing"):
        await eventually(lambda name=name: _is_phase(kube, namespace, name, "Pending"), timeout=15)
    final_row = await _row(db, f"k8s:{final['metadata']['uid']}")
    missing_row = await _row(db, f"k8s:{missing['metadata']['uid']}")
    assert final_row is not None and missing_row is not None
    # Final before the delete: cancelled as the API cancels (NotificationRepository).
    await NotificationRepository(db).notification_cancel(id=final_row["id"])
    await db.execute("kube_link_delete", {"uid": missing["metadata"]["uid"]})  # link lost

    await kube.delete("Notification", namespace, "final")
    await kube.delete("Notification", namespace, "missing")

    for name in ("final", "missing"):
        await eventually(lambda name=name: _gone(kube, namespace, name), timeout=10)
    assert (await _row(db, f"k8s:{missing['metadata']['uid']}"))["status"] == "PENDING"


async def test_a_notification_the_queue_refuses_is_rejected_with_the_reason(
    kube: Kube, namespace: str, operator: OperatorThread, db: Database
) -> None:
    # The schema cannot measure metadata as JSON; the queue's validation can.
    await kube.create(notification(namespace, "too-much", metadata={"blob": "x" * 17_000}))

    async def rejected() -> object:
        obj = await kube.get("Notification", namespace, "too-much")
        return phase(obj) == "Rejected" and obj

    obj = await eventually(rejected, timeout=15)
    accepted = condition(obj, "Accepted")
    assert accepted["status"] == "False" and accepted["reason"] == "Invalid"
    assert "spec.metadata" in accepted["message"] and "16384" in accepted["message"]
    events = await eventually(lambda: kube.events(namespace, name="too-much"))
    assert any(e["reason"] == "Rejected" and e["type"] == "Warning" for e in events)
    assert (
        await db.fetch_all(
            "notification_list",
            {
                "status": None,
                "channel": None,
                "recipient": None,
                "recipient_id": None,
                "after_created_at": None,
                "after_id": None,
                "limit": 10,
            },
        )
        == []
    )


async def test_an_idempotency_key_taken_by_another_request_is_rejected_as_a_conflict(
    kube: Kube, namespace: str, operator: OperatorThread
) -> None:
    key = f"order-{uuid.uuid4().hex[:8]}"
    await kube.create(notification(namespace, "first", idempotencyKey=key, body="one"))
    await eventually(lambda: _is_phase(kube, namespace, "first", "Pending"), timeout=15)
    await kube.create(notification(namespace, "second", idempotencyKey=key, body="two"))

    async def rejected() -> object:
        obj = await kube.get("Notification", namespace, "second")
        return phase(obj) == "Rejected" and obj

    obj = await eventually(rejected, timeout=15)
    accepted = condition(obj, "Accepted")
    assert accepted["reason"] == "IdempotencyKeyConflict" and key in accepted["message"]


async def test_the_same_explicit_key_and_request_on_a_new_object_shows_the_original(
    kube: Kube, namespace: str, start_operator: StartOperator, db: Database
) -> None:
    await start_operator()
    key = f"order-{uuid.uuid4().hex[:8]}"
    spec = {"idempotencyKey": key, "recipient": "same@example.com", "delay": "1h"}
    await kube.create(notification(namespace, "original", **spec))
    await eventually(lambda: _is_phase(kube, namespace, "original", "Pending"), timeout=15)
    await kube.create(notification(namespace, "again", **spec))
    await eventually(lambda: _is_phase(kube, namespace, "again", "Pending"), timeout=15)
    first = await kube.get("Notification", namespace, "original")
    again = await kube.get("Notification", namespace, "again")
    assert first["status"]["notificationId"] == again["status"]["notificationId"]

    # Deleting one of two objects of a row does not cancel it for the other.
    await kube.delete("Notification", namespace, "original")
    await eventually(lambda: _gone(kube, namespace, "original"), timeout=10)
    assert (await _row(db, key))["status"] == "PENDING"


async def _is_phase(kube: Kube, namespace: str, name: str, expected: str) -> bool:
    return phase(await kube.get("Notification", namespace, name)) == expected


async def _gone(kube: Kube, namespace: str, name: str) -> bool:
    return await kube.get("Notification", namespace, name) is None


async def test_a_cluster_wide_operator_handles_every_namespace(
    control_plane: LocalControlPlane, database_url: str, db: Database, tmp_path: Path
) -> None:
    # On a control plane of its own: a cluster-wide operator on the shared one would take over
    # every other test's objects.
    with LocalControlPlane(tmp_path / "k8s", bin_dir=control_plane.bin_dir) as cluster:
        cluster.install_crds()
        cluster.kubectl("create", "namespace", "team-a")
        cluster.kubectl("create", "namespace", "team-b")
        kube = Kube(cluster)
        operator = OperatorThread(settings_for(database_url, None), cluster.kubeconfig)
        try:
            await operator.start()
            for namespace in ("team-a", "team-b"):
                await kube.create(notification(namespace, "hello", delay="1h"))
            for namespace in ("team-a", "team-b"):
                await eventually(
                    lambda ns=namespace: _is_phase(kube, ns, "hello", "Pending"), timeout=15
                )
        finally:
            await operator.stop()
            await kube.close()
    rows = await db.fetch_all(
        "notification_list",
        {
            "status": None,
            "channel": None,
            "recipient": None,
            "recipient_id": None,
            "after_created_at": None,
            "after_id": None,
            "limit": 10,
        },
    )
    assert sorted(r["policy"] for r in rows) == ["team-a/default", "team-b/default"]
