"""The rules between resources and the queue (`services.kube`) on their own: a Notification spec
becomes the API's request, a NotificationPolicy a policy (a row's status: test_conditions.py).
No cluster, no database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from notify_queue.errors import ValidationFailed
from notify_queue.models import Channel, ChannelRateLimit, Policy, Priority, Source, Status
from notify_queue.services.kube import (
    PHASES,
    acknowledged_by,
    new_notification_from_spec,
    parse_duration_seconds,
    policy_from_spec,
    prepared_from_spec,
    secret_ref_from_spec,
)

NOW = datetime(2026, 9, 24, 12, 0, tzinfo=UTC)
UID = "0b7c2f4e-8f5e-4c4e-9d55-6a1f3f0e2a11"


def _spec(**fields: object) -> dict[str, object]:
    return {
        "channel": "email",
        "recipient": "a@example.com",
        "body": "hi",
        "priority": "NORMAL",
    } | fields


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("15m", 900), ("2h", 7200), ("1h30m", 5400), ("1h0m5s", 3605), ("500ms", 0.5)],
)
def test_durations_read_like_kubernetes_durations(text: str, seconds: float) -> None:
    assert parse_duration_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "5 minutes", "1d", "m", "-5s"])
def test_anything_else_is_not_a_duration(text: str) -> None:
    with pytest.raises(ValueError, match="must be a duration"):
        parse_duration_seconds(text)


def test_a_spec_becomes_a_kubernetes_notification_keyed_by_the_objects_uid() -> None:
    new = new_notification_from_spec(
        namespace="shop",
        uid=UID,
        now=NOW,
        spec=_spec(
            subject="Order",
            priority="HIGH",
            delay="1h30m",
            metadata={"order": 1},
            webhookUrl="https://hooks.example.com/n",
        ),
    )
    assert new.idempotency_key == f"k8s:{UID}"
    assert new.source is Source.KUBERNETES
    assert (new.channel, new.priority, new.subject) == (Channel.EMAIL, Priority.HIGH, "Order")
    assert new.send_at == NOW + timedelta(minutes=90)
    assert new.policy == "shop/default"
    assert new.metadata == {"order": 1} and new.webhook_url == "https://hooks.example.com/n"


def test_an_explicit_key_and_policy_are_kept() -> None:
    new = new_notification_from_spec(
        namespace="shop", uid=UID, now=NOW, spec=_spec(idempotencyKey="order-1", policy="receipts")
    )
    assert (new.idempotency_key, new.policy) == ("order-1", "shop/receipts")


def test_the_same_spec_is_the_same_request_at_any_time() -> None:
    spec = _spec(delay="5m")
    first = new_notification_from_spec(namespace="shop", uid=UID, now=NOW, spec=spec)
    later = new_notification_from_spec(
        namespace="shop", uid=UID, now=NOW + timedelta(hours=3), spec=spec
    )
    other = new_notification_from_spec(namespace="shop", uid=UID, now=NOW, spec=_spec(delay="6m"))
    assert first.request_hash == later.request_hash != other.request_hash


def test_what_the_schema_cannot_check_is_refused_with_spec_field_names() -> None:
    with pytest.raises(ValidationFailed) as caught:
        new_notification_from_spec(
            namespace="shop",
            uid=UID,
            now=NOW,
            spec=_spec(
                delay="1h",
                expiresAt="2026-09-24T12:30:00Z",
                metadata={"blob": "x" * 17_000},
            ),
        )
    fields = {e.field for e in caught.value.errors}
    assert "spec.metadata" in fields


def test_an_expiry_before_a_delayed_send_time_is_refused() -> None:
    with pytest.raises(ValidationFailed) as caught:
        new_notification_from_spec(
            namespace="shop",
            uid=UID,
            now=NOW,
            spec=_spec(delay="1h", expiresAt="2026-09-24T12:30:00Z"),
        )
    assert [e.field for e in caught.value.errors] == ["spec.expiresAt"]


def test_a_bad_delay_names_the_delay_field() -> None:
    with pytest.raises(ValidationFailed) as caught:
        new_notification_from_spec(namespace="shop", uid=UID, now=NOW, spec=_spec(delay="500ms"))
    assert [e.field for e in caught.value.errors] == ["spec.delay"]


def test_a_policy_spec_and_its_secret_become_a_policy() -> None:
    policy = policy_from_spec(
        namespace="shop",
        name="receipts",
        webhook_secret="whsec_b2xk, whsec_bmV3",
        spec={
            "rateLimit": {"maxPerWindow": 5, "window": "1h"},
            "retry": {"maxAttempts": 3, "initialBackoff": "500ms", "maxBackoff": "1m"},
            "webhook": {"url": "https://hooks.example.com", "secretRef": {"name": "s", "key": "k"}},
            "ttlSecondsAfterFinished": 60,
        },
    )
    assert policy == Policy(
        name="shop/receipts",
        rate_limit=5,
        rate_window_seconds=3600.0,
        max_attempts=3,
        backoff_base_seconds=0.5,
        backoff_max_seconds=60.0,
        webhook_url="https://hooks.example.com",
        webhook_secrets=("whsec_b2xk", "whsec_bmV3"),
        ttl_seconds_after_finished=60,
    )
    assert policy_from_spec(namespace="shop", name="empty", spec={}, webhook_secret=None) == Policy(
        name="shop/empty"
    )


def test_a_policy_limits_a_channel_beside_the_recipient() -> None:
    policy = policy_from_spec(
        namespace="shop",
        name="texts",
        webhook_secret=None,
        spec={
            "rateLimit": {
                "maxPerWindow": 20,
                "window": "1h",
                "channels": {"sms": {"maxPerWindow": 2, "window": "1m"}},
            }
        },
    )
    assert policy.rate_limit == 20
    assert policy.channel_rate_limits == {"sms": ChannelRateLimit(2, 60.0)}


def test_a_channel_limit_for_no_channel_names_its_field() -> None:
    with pytest.raises(ValidationFailed) as caught:
        policy_from_spec(
            namespace="shop",
            name="p",
            webhook_secret=None,
            spec={
                "rateLimit": {
                    "maxPerWindow": 20,
                    "window": "1h",
                    "channels": {"fax": {"maxPerWindow": 2, "window": "1m"}},
                }
            },
        )
    assert [e.field for e in caught.value.errors] == ["spec.rateLimit.channels.fax"]


def test_a_secret_that_is_not_a_signing_key_is_refused() -> None:
    with pytest.raises(ValidationFailed, match="whsec_"):
        policy_from_spec(namespace="shop", name="p", spec={}, webhook_secret="hunter2")


def test_every_status_has_a_phase() -> None:
    assert set(PHASES) == set(Status)
    assert sorted(PHASES.values()) == sorted(
        [
            "Pending",
            "Processing",
            "Sent",
            "Failed",
            "DeadLettered",
            "Cancelled",
            "Expired",
            "Suppressed",
        ]
    )


def test_acknowledged_by_names_the_annotation_author_or_kubernetes() -> None:
    ack = "notifyqueue.io/acknowledged"
    assert acknowledged_by({}) is None
    assert acknowledged_by({ack: "false", f"{ack}-by": "eve"}) is None
    assert acknowledged_by({ack: "true"}) == "kubernetes"
    assert acknowledged_by({ack: "true", f"{ack}-by": "  "}) == "kubernetes"
    assert acknowledged_by({ack: "true", f"{ack}-by": "ana"}) == "ana"
    assert acknowledged_by({ack: "true", f"{ack}-by": "x" * 300}) == "x" * 255


def test_an_escalation_spec_becomes_the_apis_escalation_request() -> None:
    spec = {
        "recipientId": "oncall-ana",
        "body": "db-1 is down",
        "escalation": {"steps": [{"channel": "push"}, {"channel": "voice", "afterSeconds": 60}]},
    }
    p = prepared_from_spec(namespace="ops", uid="u-1", spec=spec, now=datetime.now(UTC))
    assert p.request.escalation is not None
    assert p.request.escalation.after_seconds() == [0, 60]
    assert p.idempotency_key == "k8s:u-1"
    with pytest.raises(ValidationFailed, match=r"spec\.escalation"):
        prepared_from_spec(
            namespace="ops", uid="u-2", spec={**spec, "channels": ["push"]}, now=datetime.now(UTC)
        )


@pytest.mark.parametrize(
    "name",
    ["../../kube-system/secrets/x", "..", "a/b", "A", "a..b", "-a", "a.", "", "a\n", "x" * 254],
)
def test_a_reference_that_is_not_a_kubernetes_name_is_refused_with_its_field(name: str) -> None:
    with pytest.raises(ValidationFailed) as policy_ref:
        prepared_from_spec(namespace="shop", uid=UID, spec=_spec(policy=name), now=NOW)
    assert [e.field for e in policy_ref.value.errors] == ["spec.policy"]
    with pytest.raises(ValidationFailed) as secret_ref:
        secret_ref_from_spec(
            {"webhook": {"url": "https://h.example", "secretRef": {"name": name, "key": "k"}}}
        )
    assert [e.field for e in secret_ref.value.errors] == ["spec.webhook.secretRef.name"]


@pytest.mark.parametrize("key", ["../k", "a/b", "", "k k", "k\n"])
def test_a_secret_key_with_other_characters_is_refused(key: str) -> None:
    with pytest.raises(ValidationFailed) as refused:
        secret_ref_from_spec(
            {"webhook": {"url": "https://h.example", "secretRef": {"name": "s", "key": key}}}
        )
    assert [e.field for e in refused.value.errors] == ["spec.webhook.secretRef.key"]


def test_names_kubernetes_accepts_are_references() -> None:
    ref = secret_ref_from_spec(
        {
            "webhook": {
                "url": "https://h.example",
                "secretRef": {"name": "hooks.v2-a", "key": "Sign_1.k-2"},
            }
        }
    )
    assert ref is not None and (ref.name, ref.key) == ("hooks.v2-a", "Sign_1.k-2")
    assert secret_ref_from_spec({"webhook": {"url": "https://h.example"}}) is None
    prepared_from_spec(
        namespace="shop",
        uid=UID,
        spec=_spec(policy="a.b-c", digest={"key": "k", "windowSeconds": 60, "template": "t.1"}),
        now=NOW,
    )
