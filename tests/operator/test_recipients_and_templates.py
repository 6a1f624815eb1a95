"""Recipients and templates through Kubernetes (CONTRACT §9), with the real kubectl and
kube-apiserver: a NotificationTemplate applied from a manifest is mirrored into the templates
table and reports Ready with its version; a Notification with `recipientId` and `template`
becomes one rendered notification per channel, listed in `status.notifications`; one whose
recipient opted out of everything reaches phase Suppressed; the CRD refuses the combinations the
API refuses with 400."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from notify_queue.devcluster import LocalControlPlane
from notify_queue.repositories.db import Database
from notify_queue.repositories.recipients import RecipientRepository
from notify_queue.services.recipients import RecipientService
from tests.api.support import sql
from tests.operator.support import GROUP_VERSION, Kube, OperatorThread, condition, phase
from tests.support import eventually

pytestmark = pytest.mark.kubernetes

RECEIPT = {
    "channels": {
        "email": {"subject": "Order {{ order }}", "body": "Hello {{ name }}"},
        "sms": {"body": "Order {{ order }} for {{ name }}"},
    }
}


def apply(cluster: LocalControlPlane, kind: str, namespace: str, name: str, spec: Any) -> None:
    manifest = {
        "apiVersion": GROUP_VERSION,
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))


async def ready_template(kube: Kube, namespace: str, name: str, version: int) -> dict[str, Any]:
    async def check() -> Any:
        obj = await kube.get("NotificationTemplate", namespace, name)
        ready = condition(obj, "Ready")
        return (
            ready
            and ready["status"] == "True"
            and (obj or {})["status"].get("version") == version
            and obj
        )

    result: dict[str, Any] = await eventually(check, timeout=20, what="template Ready")
    return result


async def test_a_notification_template_manifest_is_mirrored_and_ready(
    control_plane: LocalControlPlane,
    kube: Kube,
    namespace: str,
    operator: OperatorThread,
    database_url: str,
) -> None:
    apply(control_plane, "NotificationTemplate", namespace, "receipt", RECEIPT)
    obj = await ready_template(kube, namespace, "receipt", 1)
    assert obj["status"]["templateName"] == f"{namespace}.receipt"
    rows = await sql(
        database_url,
        "SELECT version, source, channels FROM nq_templates WHERE name = %s",
        (f"{namespace}.receipt",),
    )
    assert rows == [(1, "kubernetes", RECEIPT["channels"])]
    changed = {"channels": {"sms": {"body": "Order {{ order }}"}}}
    apply(control_plane, "NotificationTemplate", namespace, "receipt", changed)
    await ready_template(kube, namespace, "receipt", 2)
    got = control_plane.kubectl("get", "ntpl", "-n", namespace).stdout
    assert "VERSION" in got and "READY" in got
    await kube.delete("NotificationTemplate", namespace, "receipt")
    await eventually(
        lambda: _no_template(database_url, f"{namespace}.receipt"), what="template deleted"
    )


async def _no_template(database_url: str, name: str) -> bool:
    return not await sql(database_url, "SELECT 1 FROM nq_templates WHERE name = %s", (name,))


async def test_a_notification_for_a_recipient_becomes_one_rendered_row_per_channel(
    control_plane: LocalControlPlane,
    kube: Kube,
    namespace: str,
    operator: OperatorThread,
    db: Database,
    database_url: str,
) -> None:
    recipients = RecipientService(RecipientRepository(db))
    await recipients.put("ada", {"email": "ada@example.com", "phone": "+4915112345678"})
    await recipients.put(
        "quiet", {"email": "q@example.com", "preferences": {"optOut": {"all": True}}}
    )
    apply(control_plane, "NotificationTemplate", namespace, "receipt", RECEIPT)
    await ready_template(kube, namespace, "receipt", 1)
    data = {"order": 42, "name": "Ada"}
    apply(
        control_plane,
        "Notification",
        namespace,
        "welcome",
        {"recipientId": "ada", "template": "receipt", "data": data, "category": "marketing"},
    )

    async def listed() -> Any:
        obj = await kube.get("Notification", namespace, "welcome")
        ids = ((obj or {}).get("status") or {}).get("notifications")
        return ids and len(ids) == 2 and phase(obj) == "Pending" and ids

    ids = await eventually(listed, timeout=20, what="status.notifications")
    assert "Accepted" in {e["reason"] for e in await kube.events(namespace, name="welcome")}
    rows = await sql(
        database_url,
        "SELECT channel, recipient, subject, body, template_name, template_version, category "
        "FROM nq_all_notifications WHERE id = ANY(%s::uuid[]) ORDER BY channel",
        (ids,),
    )
    assert rows == [
        (
            "email",
            "ada@example.com",
            "Order 42",
            "Hello Ada",
            f"{namespace}.receipt",
            1,
            "marketing",
        ),
        ("sms", "+4915112345678", None, "Order 42 for Ada", f"{namespace}.receipt", 1, "marketing"),
    ]

    # Deleting the object cancels every notification it became, not only the first.
    await kube.delete("Notification", namespace, "welcome")

    async def cancelled() -> bool:
        found = await sql(
            database_url,
            "SELECT status FROM nq_all_notifications WHERE id = ANY(%s::uuid[])",
            (ids,),
        )
        return found == [("CANCELLED",), ("CANCELLED",)]

    await eventually(cancelled, timeout=20, what="both cancelled")

    apply(
        control_plane,
        "Notification",
        namespace,
        "ignored",
        {"recipientId": "quiet", "body": "hello"},
    )

    async def suppressed() -> Any:
        obj = await kube.get("Notification", namespace, "ignored")
        return phase(obj) == "Suppressed" and obj

    obj = await eventually(suppressed, timeout=20, what="phase Suppressed")
    assert "opted out of everything" in obj["status"]["lastError"]

    apply(
        control_plane,
        "Notification",
        namespace,
        "broken",
        {"recipientId": "ada", "template": "receipt", "data": {"order": 1}},
    )

    async def rejected() -> Any:
        obj = await kube.get("Notification", namespace, "broken")
        return phase(obj) == "Rejected" and obj

    obj = await eventually(rejected, timeout=20, what="phase Rejected")
    assert "'name' is undefined" in json.dumps(obj["status"])


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"recipientId": "ada", "channel": "email", "recipient": "a@example.com", "body": "x"},
            "give channel and recipient, or recipientId (not both)",
        ),
        ({"channel": "email", "body": "x"}, "give channel and recipient, or recipientId"),
        (
            {"recipientId": "ada", "template": "receipt", "body": "x"},
            "give body (and subject), or template (not both)",
        ),
        ({"recipientId": "ada", "body": "x", "data": {"a": 1}}, "data is only for a template"),
        (
            {"channel": "email", "recipient": "a@example.com", "body": "x", "strategy": "first"},
            "channels and strategy are only for recipientId",
        ),
        ({"recipientId": "ada", "body": "x", "channels": ["fax"]}, 'Unsupported value: "fax"'),
        ({"recipientId": "ada", "body": "x", "category": "Mark ETING"}, "category must be"),
    ],
    ids=["both", "no recipient", "template and body", "data alone", "strategy", "fax", "category"],
)
def test_the_crd_refuses_what_the_api_refuses(
    control_plane: LocalControlPlane, spec: dict[str, Any], message: str
) -> None:
    namespace = f"crd-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", namespace)
    manifest = {
        "apiVersion": GROUP_VERSION,
        "kind": "Notification",
        "metadata": {"name": "x", "namespace": namespace},
        "spec": spec,
    }
    result = control_plane.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=False)
    assert result.returncode != 0
    assert message in result.stderr
