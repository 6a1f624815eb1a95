"""The CRDs on a real kube-apiserver, through the real kubectl: bad manifests are refused with a
message a person understands, a Notification's spec cannot be changed, and `kubectl get` shows
the contract's columns. No operator runs here: this is the API server's own validation."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from notify_queue.devcluster import LocalControlPlane

pytestmark = pytest.mark.kubernetes


def _apply(
    cluster: LocalControlPlane, namespace: str, kind: str, spec: dict[str, Any]
) -> tuple[int, str]:
    manifest = {
        "apiVersion": "notifyqueue.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": f"x-{uuid.uuid4().hex[:8]}", "namespace": namespace},
        "spec": spec,
    }
    result = cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=False)
    return result.returncode, result.stderr


@pytest.fixture(scope="module")
def crd_namespace(control_plane: LocalControlPlane) -> str:
    name = f"crd-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", name)
    return name


GOOD = {"channel": "email", "recipient": "a@example.com", "body": "hi"}
NOTIFICATION_CASES = [
    "unknown channel",
    "email recipient",
    "sms recipient",
    "blank recipient",
    "unknown priority",
    "empty body",
    "body over 65536 bytes",
    "long subject",
    "sendAt and delay",
    "sendAt without T",
    "sendAt without offset",
    "delay in words",
    "delay over a year",
    "expiry before send",
    "ftp webhook",
    "key with space",
    "policy name",
    "unknown field",
    "digest without window",
    "digest window zero",
    "digest max items one",
    "digest key with space",
    "digest unknown field",
]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"channel": "fax"},
            'spec.channel: Unsupported value: "fax": supported values: "email", "sms", "push"',
        ),
        (
            {"recipient": "not-an-address"},
            "recipient must be an email address (name@example.com) when channel is email",
        ),
        (
            {"channel": "sms", "recipient": "12345"},
            "recipient must be an E.164 phone number (+ and 8-15 digits) when channel is sms",
        ),
        ({"channel": "push", "recipient": "   "}, "recipient must not be blank"),
        ({"priority": "URGENT"}, 'spec.priority: Unsupported value: "URGENT"'),
        ({"body": ""}, "spec.body in body should be at least 1 chars long"),
        # 40,000 characters are within maxLength but 80,000 bytes of UTF-8.
        ({"body": "é" * 40_000}, "body must be at most 65536 bytes of UTF-8"),
        ({"subject": "s" * 999}, "spec.subject: Too long: may not be more than 998"),
        ({"sendAt": "2026-09-24T12:00:00Z", "delay": "5m"}, "give sendAt or delay, not both"),
        ({"sendAt": "2026-09-24 12:00"}, "sendAt must be an RFC 3339 date-time with an offset"),
        ({"sendAt": "2026-09-24T12:00:00"}, "sendAt must be an RFC 3339 date-time with an offset"),
        ({"delay": "5 minutes"}, "delay must be a duration such as 90s, 15m, 2h or 1h30m"),
        ({"delay": "9000h"}, "delay must be at most one year (8760h)"),
        (
            {"sendAt": "2026-09-24T12:00:00Z", "expiresAt": "2026-09-24T11:00:00Z"},
            "expiresAt must be after sendAt",
        ),
        ({"webhookUrl": "ftp://example.com/x"}, "webhookUrl must be an http or https URL"),
        (
            {"idempotencyKey": "has space"},
            "idempotencyKey must be printable ASCII characters without spaces",
        ),
        (
            {"policy": "Not_A_Name"},
            "policy must be the name of a NotificationPolicy in this namespace",
        ),
        ({"colour": "blue"}, 'unknown field "spec.colour"'),
        ({"digest": {"key": "likes"}}, "spec.digest.windowSeconds: Required value"),
        (
            {"digest": {"key": "likes", "windowSeconds": 0}},
            "spec.digest.windowSeconds: Invalid value: 0",
        ),
        (
            {"digest": {"key": "likes", "windowSeconds": 60, "maxItems": 1}},
            "spec.digest.maxItems: Invalid value: 1",
        ),
        (
            {"digest": {"key": "has space", "windowSeconds": 60}},
            "digest.key must be printable ASCII characters without spaces",
        ),
        (
            {"digest": {"key": "likes", "windowSeconds": 60, "colour": "blue"}},
            'unknown field "spec.digest.colour"',
        ),
    ],
    ids=NOTIFICATION_CASES,
)
def test_a_bad_notification_manifest_is_refused_with_a_clear_message(
    control_plane: LocalControlPlane, crd_namespace: str, change: dict[str, Any], message: str
) -> None:
    code, stderr = _apply(control_plane, crd_namespace, "Notification", GOOD | change)
    assert code != 0
    assert message in stderr


def test_every_bad_field_is_named_at_once(
    control_plane: LocalControlPlane, crd_namespace: str
) -> None:
    code, stderr = _apply(
        control_plane,
        crd_namespace,
        "Notification",
        {
            "channel": "sms",
            "recipient": "123",
            "body": "hi",
            "delay": "forever",
            "webhookUrl": "mailto:x",
            "idempotencyKey": "a b",
        },
    )
    assert code != 0
    for field in ("spec.recipient", "spec.delay", "spec.webhookUrl", "spec.idempotencyKey"):
        assert field in stderr


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"rateLimit": {"maxPerWindow": 0, "window": "1h"}},
            "spec.rateLimit.maxPerWindow in body should be greater than or equal to 1",
        ),
        (
            {"rateLimit": {"maxPerWindow": 5, "window": "an hour"}},
            "window must be a duration such as 90s, 15m, 1h or 1h30m",
        ),
        (
            {"retry": {"maxAttempts": 0}},
            "spec.retry.maxAttempts in body should be greater than or equal to 1",
        ),
        (
            {"retry": {"initialBackoff": "5m", "maxBackoff": "1m"}},
            "initialBackoff must not exceed maxBackoff",
        ),
        (
            {"retry": {"initialBackoff": "soon"}},
            "initialBackoff must be a positive duration such as 500ms, 2s or 1m",
        ),
        ({"webhook": {"url": "hooks.example.com"}}, "webhook.url must be an http or https URL"),
        (
            {"webhook": {"url": "https://hooks.example.com", "secretRef": {"name": "s"}}},
            "spec.webhook.secretRef.key: Required value",
        ),
        (
            {"ttlSecondsAfterFinished": -1},
            "spec.ttlSecondsAfterFinished in body should be greater than or equal to 0",
        ),
    ],
    ids=[
        "zero per window",
        "window in words",
        "zero attempts",
        "backoffs swapped",
        "backoff in words",
        "webhook without scheme",
        "secretRef without key",
        "negative ttl",
    ],
)
def test_a_bad_policy_manifest_is_refused_with_a_clear_message(
    control_plane: LocalControlPlane, crd_namespace: str, spec: dict[str, Any], message: str
) -> None:
    code, stderr = _apply(control_plane, crd_namespace, "NotificationPolicy", spec)
    assert code != 0
    assert message in stderr


def test_a_good_manifest_is_accepted_with_defaults(
    control_plane: LocalControlPlane, crd_namespace: str
) -> None:
    name = f"ok-{uuid.uuid4().hex[:8]}"
    manifest = {
        "apiVersion": "notifyqueue.io/v1alpha1",
        "kind": "Notification",
        "metadata": {"name": name, "namespace": crd_namespace},
        "spec": GOOD | {"delay": "1h30m", "metadata": {"order": 1001, "tags": ["a"]}},
    }
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    stored = json.loads(
        control_plane.kubectl("get", "notif", name, "-n", crd_namespace, "-o", "json").stdout
    )
    assert stored["spec"]["priority"] == "NORMAL"
    assert stored["spec"]["metadata"] == {"order": 1001, "tags": ["a"]}


@pytest.mark.parametrize(
    ("channel", "recipient"),
    [("chat", "ops#alerts"), ("webhook", "ci"), ("incident", "db-team")],
)
def test_a_notification_to_a_destination_is_accepted(
    control_plane: LocalControlPlane, crd_namespace: str, channel: str, recipient: str
) -> None:
    spec = {"channel": channel, "recipient": recipient, "body": "{}"}
    code, stderr = _apply(control_plane, crd_namespace, "Notification", spec)
    assert code == 0, stderr


def test_the_spec_of_a_notification_cannot_be_changed(
    control_plane: LocalControlPlane, crd_namespace: str
) -> None:
    name = f"fixed-{uuid.uuid4().hex[:8]}"
    manifest = {
        "apiVersion": "notifyqueue.io/v1alpha1",
        "kind": "Notification",
        "metadata": {"name": name, "namespace": crd_namespace},
        "spec": GOOD,
    }
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    changed = control_plane.kubectl(
        "patch",
        "notification",
        name,
        "-n",
        crd_namespace,
        "--type",
        "merge",
        "-p",
        '{"spec": {"body": "something else"}}',
        check=False,
    )
    assert changed.returncode != 0
    assert (
        "spec is immutable; create a new Notification instead of changing this one"
        in changed.stderr
    )
    # Labels and annotations are not the spec: they may change.
    control_plane.kubectl("label", "notification", name, "-n", crd_namespace, "team=growth")


def test_kubectl_get_shows_the_contract_columns(
    control_plane: LocalControlPlane, crd_namespace: str
) -> None:
    policy = {
        "apiVersion": "notifyqueue.io/v1alpha1",
        "kind": "NotificationPolicy",
        "metadata": {"name": "columns", "namespace": crd_namespace},
        "spec": {"rateLimit": {"maxPerWindow": 5, "window": "1h"}, "retry": {"maxAttempts": 3}},
    }
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(policy))

    notifs = control_plane.kubectl("get", "notif", "-n", crd_namespace).stdout.splitlines()
    npols = control_plane.kubectl("get", "npol", "-n", crd_namespace).stdout.splitlines()

    assert notifs[0].split() == [
        "NAME",
        "PHASE",
        "CHANNEL",
        "RECIPIENT",
        "PRIORITY",
        "ATTEMPTS",
        "WAITING",
        "AGE",
    ]
    assert npols[0].split() == ["NAME", "RATE", "WINDOW", "MAX-ATTEMPTS", "READY", "AGE"]
    assert npols[1].split()[:4] == ["columns", "5", "1h", "3"]
    # Both kinds are in the notify-queue category.
    everything = control_plane.kubectl("get", "notify-queue", "-n", crd_namespace).stdout
    assert "notificationpolicy.notifyqueue.io/columns" in everything
