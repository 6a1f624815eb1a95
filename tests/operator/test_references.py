"""Names that refer to other objects cannot leave their namespace, on a real kube-apiserver.

A NotificationPolicy names a Secret (webhook.secretRef: name and key), a Notification names a
NotificationPolicy (spec.policy) and NotificationTemplates (spec.template, spec.digest.template).
Each such field is a DNS-1123 name (a key: a Secret key) in the CRD schema, so a manifest with
`../../<namespace>/secrets/<name>` is refused; and the operator checks the names again before it
uses them, so the same spec handed straight to its mirrors (as if the schema had let it through)
never reads the other namespace's Secret. docs/security.md.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from notify_queue.devcluster import LocalControlPlane
from notify_queue.operator.kubeapi import KubeApi, KubeRefused, load_kube_configuration
from notify_queue.operator.mirror import NotificationMirror, PolicyMirror
from notify_queue.repositories.db import Database
from notify_queue.repositories.kube import KubeRepository
from notify_queue.repositories.policies import PolicyRepository
from notify_queue.services.kube import OBJECT_NAME_PATTERN, SECRET_KEY_PATTERN
from tests.api.support import sql
from tests.operator.support import Kube, condition, notification, phase, policy
from tests.support import notification_service

pytestmark = pytest.mark.kubernetes

CRDS = Path(__file__).resolve().parents[2] / "crds"
VICTIM_KEY = "whsec_" + base64.b64encode(b"another namespace's signing key!").decode()


@pytest.fixture
async def kube_api(control_plane: LocalControlPlane) -> AsyncIterator[KubeApi]:
    api = KubeApi(load_kube_configuration(control_plane.kubeconfig))
    yield api
    await api.close()


@pytest.fixture
async def victim(kube: Kube) -> str:
    """Another namespace, with a Secret `victim` holding a signing key under `key`."""
    namespace = await kube.namespace_create()
    await kube.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "victim", "namespace": namespace},
            "stringData": {"key": VICTIM_KEY},
        }
    )
    return namespace


def _traversal(victim: str) -> str:
    return f"../../{victim}/secrets/victim"


# --- the CRD schema ---------------------------------------------------------------------------


def _policy_spec(name: str, key: str) -> dict[str, Any]:
    return {
        "webhook": {"url": "https://hooks.example.com/in", "secretRef": {"name": name, "key": key}}
    }


# (kind, spec with the bad name in place of NAME, the field the API server names)
SCHEMA_CASES = {
    "secretRef.name": (
        "NotificationPolicy",
        lambda bad: _policy_spec(bad, "key"),
        "spec.webhook.secretRef.name",
    ),
    "secretRef.key": (
        "NotificationPolicy",
        lambda bad: _policy_spec("hooks", bad),
        "spec.webhook.secretRef.key",
    ),
    "policy": (
        "Notification",
        lambda bad: {"channel": "email", "recipient": "a@example.com", "body": "hi", "policy": bad},
        "spec.policy",
    ),
    "template": (
        "Notification",
        lambda bad: {"channel": "email", "recipient": "a@example.com", "template": bad},
        "spec.template",
    ),
    "digest.template": (
        "Notification",
        lambda bad: {
            "channel": "email",
            "recipient": "a@example.com",
            "body": "hi",
            "digest": {"key": "k", "windowSeconds": 60, "template": bad},
        },
        "spec.digest.template",
    ),
}


@pytest.mark.parametrize("field", SCHEMA_CASES)
async def test_the_crd_refuses_a_reference_that_walks_out_of_its_namespace(
    control_plane: LocalControlPlane, kube: Kube, namespace: str, victim: str, field: str
) -> None:
    kind, spec_with, named = SCHEMA_CASES[field]
    name = f"x-{uuid.uuid4().hex[:8]}"
    manifest = {
        "apiVersion": "notifyqueue.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec_with(_traversal(victim)),
    }
    result = control_plane.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=False)
    assert result.returncode != 0, f"{field}: a traversal was accepted"
    assert named in result.stderr, result.stderr
    assert await kube.get(kind, namespace, name) is None


def _schema_at(crd: str, *path: str) -> dict[str, Any]:
    document = yaml.safe_load((CRDS / crd).read_text())
    node = document["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for step in path:
        node = node["properties"][step]
    return dict(node)


def test_every_reference_field_carries_the_pattern_the_operator_checks() -> None:
    # The operator's check (services/kube.py) and the schema's are one pattern.
    for crd, path in [
        ("notificationpolicies.yaml", ("webhook", "secretRef", "name")),
        ("notifications.yaml", ("policy",)),
        ("notifications.yaml", ("template",)),
        ("notifications.yaml", ("digest", "template")),
    ]:
        assert _schema_at(crd, *path)["pattern"] == OBJECT_NAME_PATTERN, path
    key = _schema_at("notificationpolicies.yaml", "webhook", "secretRef", "key")
    assert key["pattern"] == SECRET_KEY_PATTERN


# --- the operator's code, handed the bad names directly ----------------------------------------


@pytest.mark.parametrize("field", ["name", "key"])
async def test_the_policy_mirror_never_reads_a_secret_named_by_a_traversal(
    kube: Kube, kube_api: KubeApi, namespace: str, victim: str, db: Database, field: str
) -> None:
    # A real policy object (for its uid and status); its spec as the mirror sees it is the bad one.
    created = await kube.create(policy(namespace, "sneaky"))
    ref = {"name": "victim", "key": "key"}
    ref[field] = _traversal(victim) if field == "name" else f"../{victim}/victim/key"
    if field == "key":
        # A Secret of the policy's own namespace, under the victim's name: the key alone is bad.
        await kube.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "victim", "namespace": namespace},
                "stringData": {"key": VICTIM_KEY},
            }
        )
    mirror = PolicyMirror(PolicyRepository(db), kube_api)

    ready = await mirror.changed(
        namespace=namespace,
        name="sneaky",
        uid=created["metadata"]["uid"],
        generation=1,
        spec={"webhook": {"url": "https://hooks.example.com/in", "secretRef": ref}},
    )

    assert ready is False
    mirrored = await PolicyRepository(db).policy_get(name=f"{namespace}/sneaky")
    assert mirrored is not None and mirrored.webhook_secrets == ()
    status = condition(await kube.get("NotificationPolicy", namespace, "sneaky"), "Ready")
    assert status is not None and status["reason"] == "Invalid", status
    assert f"spec.webhook.secretRef.{field}" in status["message"]
    assert VICTIM_KEY not in json.dumps(status)


async def test_the_kube_api_puts_a_name_in_one_path_segment(
    kube_api: KubeApi, namespace: str, victim: str
) -> None:
    # Under the schema and the mirror's check: a name is one quoted segment, never a path.
    try:
        value = await kube_api.secret_value(namespace=namespace, name=_traversal(victim), key="key")
    except KubeRefused:
        value = None
    assert value is None
    with pytest.raises(KubeRefused):
        await kube_api.secret_value(namespace=namespace, name="..", key="key")
    # The Secret is there, read by its own namespace and name.
    assert await kube_api.secret_value(namespace=victim, name="victim", key="key") == VICTIM_KEY


@pytest.mark.parametrize(
    ("field", "spec"),
    [
        ("spec.policy", {"body": "hi", "policy": "../../{victim}/notificationpolicies/default"}),
        ("spec.template", {"template": "../../{victim}/notificationtemplates/t"}),
        (
            "spec.digest.template",
            {"body": "hi", "digest": {"key": "k", "windowSeconds": 60, "template": "../{victim}"}},
        ),
    ],
    ids=["policy", "template", "digest.template"],
)
async def test_the_notification_mirror_rejects_a_reference_that_is_not_a_name(
    kube: Kube,
    kube_api: KubeApi,
    namespace: str,
    victim: str,
    db: Database,
    database_url: str,
    field: str,
    spec: dict[str, Any],
) -> None:
    created = await kube.create(notification(namespace, "sneaky"))
    bad = json.loads(json.dumps(spec).replace("{victim}", victim))
    bad.update({"channel": "email", "recipient": "a@example.com"})
    mirror = NotificationMirror(
        notification_service(db), KubeRepository(db), kube_api, database_concurrency=2
    )

    outcome = await mirror.created(
        namespace=namespace, name="sneaky", uid=created["metadata"]["uid"], generation=1, spec=bad
    )

    assert outcome == "rejected"
    obj = await kube.get("Notification", namespace, "sneaky")
    assert phase(obj) == "Rejected"
    accepted = condition(obj, "Accepted")
    assert accepted is not None and field in accepted["message"], accepted
    assert "must be the name of a" in accepted["message"]
    assert await sql(database_url, "SELECT count(*) FROM nq_all_notifications") == [(0,)]
