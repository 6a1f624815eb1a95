"""The rules between Kubernetes resources and the queue, as pure functions.

- A Notification's spec becomes the same `NotificationRequest` the HTTP API builds, so the one
  validation gate (`services.validation`) decides for both; its idempotency key defaults to
  `k8s:<uid>`, so one object is one notification however often it is mirrored.
- A NotificationPolicy's spec, plus its webhook Secret's value, becomes a `Policy`.
- Every name that refers to another object (a policy, a template, a Secret and its key) is
  checked as Kubernetes checks that object's name before anything uses it, so that none can
  point outside the object's namespace (docs/security.md); the CRDs hold the same patterns.
- A notification's row becomes the object's `.status`: see `services.kube_status`.

Nothing here talks to Kubernetes or the database; the operator does, and these rules are tested
without either.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from notify_queue.errors import FieldError, ValidationFailed
from notify_queue.limits import MAX_DELAY_SECONDS
from notify_queue.models import (
    Channel,
    ChannelRateLimit,
    Failover,
    NewNotification,
    Policy,
    Source,
    Status,
)
from notify_queue.services.validation import (
    PreparedRequest,
    parse_request,
    prepare_request,
    request_hash,
    to_new_notification,
)

GROUP = "notifyqueue.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
NOTIFICATIONS = "notifications"
POLICIES = "notificationpolicies"
TEMPLATES = "notificationtemplates"
DEFAULT_POLICY = "default"

PHASES: dict[Status, str] = {
    Status.PENDING: "Pending",
    Status.PROCESSING: "Processing",
    Status.SENT: "Sent",
    Status.FAILED: "Failed",
    Status.DEAD_LETTERED: "DeadLettered",
    Status.CANCELLED: "Cancelled",
    Status.EXPIRED: "Expired",
    Status.SUPPRESSED: "Suppressed",
}
REJECTED = "Rejected"
# `kubectl notify ack` sets it (and ACKNOWLEDGED_BY, who ran it, when the API server says):
# the operator then acknowledges the object's escalation (docs/escalation.md).
ACKNOWLEDGED = "notifyqueue.io/acknowledged"
ACKNOWLEDGED_BY = "notifyqueue.io/acknowledged-by"

# A DNS-1123 subdomain: what Kubernetes requires of a Secret's name and of our objects' names.
OBJECT_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
OBJECT_NAME_MAX_LENGTH = 253
# What Kubernetes requires of a key in a Secret's data.
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"  # noqa: S105 - a pattern, not a secret
_OBJECT_NAME = re.compile(OBJECT_NAME_PATTERN)
_SECRET_KEY = re.compile(SECRET_KEY_PATTERN)

# 90s, 15m, 2h, 1h30m; policies also take milliseconds (500ms). The CRDs check the same shapes.
_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")


def parse_duration_seconds(text: str, *, allow_milliseconds: bool = True) -> float:
    """Seconds in a duration such as `90s`, `15m`, `2h`, `1h30m` (and `500ms` if allowed)."""
    match = _DURATION.match(text.strip()) if text else None
    if not match or not any(match.groups()) or (match[4] and not allow_milliseconds):
        units = "h, m, s" + (" or ms" if allow_milliseconds else "")
        raise ValueError(f"must be a duration such as 90s, 15m, 2h or 1h30m (units {units})")
    hours, minutes, seconds, millis = (int(g) if g else 0 for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds + millis / 1000


@dataclass(frozen=True, slots=True)
class SecretRef:
    """A key of a Secret in the policy's own namespace (webhook.secretRef)."""

    name: str
    key: str


def reference_error(value: object, field: str, *, kind: str) -> FieldError | None:
    """None when `value` can be the name of a `kind` (a DNS-1123 subdomain), else the error."""
    if (
        isinstance(value, str)
        and len(value) <= OBJECT_NAME_MAX_LENGTH
        and _OBJECT_NAME.fullmatch(value)
    ):
        return None
    return FieldError(
        field,
        f"must be the name of a {kind} in this namespace (a DNS-1123 subdomain: lower case "
        "letters, digits, '-' and '.')",
    )


def secret_ref_from_spec(spec: Mapping[str, Any]) -> SecretRef | None:
    """A policy's webhook.secretRef, its name and key checked; ValidationFailed names them."""
    ref = (spec.get("webhook") or {}).get("secretRef")
    if not ref:
        return None
    errors = []
    if error := reference_error(ref.get("name"), "spec.webhook.secretRef.name", kind="Secret"):
        errors.append(error)
    key = ref.get("key")
    if not (
        isinstance(key, str) and len(key) <= OBJECT_NAME_MAX_LENGTH and _SECRET_KEY.fullmatch(key)
    ):
        errors.append(
            FieldError(
                "spec.webhook.secretRef.key",
                "must be a key of a Secret (letters, digits, '-', '_' and '.')",
            )
        )
    if errors:
        raise ValidationFailed(errors)
    return SecretRef(name=ref["name"], key=key)


def _references_checked(spec: Mapping[str, Any]) -> None:
    # The names a Notification gives of other objects of its namespace.
    digest = spec["digest"] if isinstance(spec.get("digest"), Mapping) else {}
    named = (
        (spec.get("policy"), "spec.policy", "NotificationPolicy"),
        (spec.get("template"), "spec.template", "NotificationTemplate"),
        (digest.get("template"), "spec.digest.template", "NotificationTemplate"),
    )
    errors = [
        error
        for value, field, kind in named
        if value is not None and (error := reference_error(value, field, kind=kind))
    ]
    if errors:
        raise ValidationFailed(errors)


def policy_name(namespace: str, name: str) -> str:
    """The name a NotificationPolicy has in the queue: `namespace/name`."""
    return f"{namespace}/{name}"


def template_name(namespace: str, name: str) -> str:
    """The name a NotificationTemplate has in the queue: `namespace.name` (a namespace has no
    dots, so the first one separates them; a template API name cannot hold a slash)."""
    return f"{namespace}.{name}"


def idempotency_key_for(uid: str, spec: Mapping[str, Any]) -> str:
    """The object's own key, or one derived from its uid: the same object, the same key."""
    key = spec.get("idempotencyKey")
    return str(key) if key else f"k8s:{uid}"


def request_from_spec(namespace: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The HTTP API's request body for a Notification spec (docs/api-reference.md field names).

    `delay` becomes `delaySeconds`; `policy` (a name in the object's namespace, default
    `default`) becomes `namespace/name`. The policy is stored even when it does not exist (yet):
    workers read policies when they claim, so one created later applies from then on.
    ValidationFailed when a name of another object (policy, template) is not a name.
    """
    _references_checked(spec)
    data: dict[str, Any] = {
        key: spec[key]
        for key in (
            "channel",
            "recipient",
            "subject",
            "body",
            "priority",
            "sendAt",
            "expiresAt",
            "webhookUrl",
            "metadata",
            "recipientId",
            "channels",
            "strategy",
            "category",
            "data",
            "escalation",
        )
        if spec.get(key) is not None
    }
    if spec.get("template") is not None:  # a NotificationTemplate in the object's namespace
        data["template"] = template_name(namespace, str(spec["template"]))
    if isinstance(spec.get("digest"), Mapping):
        # Its template, too, is a NotificationTemplate in the object's namespace.
        digest = dict(spec["digest"])
        if digest.get("template") is not None:
            digest["template"] = template_name(namespace, str(digest["template"]))
        data["digest"] = digest
    if spec.get("delay") is not None:
        data["delaySeconds"] = spec["delay"]  # replaced by seconds in prepared_from_spec
    data["policy"] = policy_name(namespace, str(spec.get("policy") or DEFAULT_POLICY))
    return data


def prepared_from_spec(
    *,
    namespace: str,
    uid: str,
    spec: Mapping[str, Any],
    now: datetime,
    default_region: str | None = None,
) -> PreparedRequest:
    """The request to enqueue for a Notification object, its recipient normalised as the API's
    is (`default_region`: --default-region); ValidationFailed names spec fields.

    The service renders its template and expands its recipientId, as for the HTTP API."""
    data = request_from_spec(namespace, spec)
    if "delaySeconds" in data:
        try:
            seconds = parse_duration_seconds(str(data["delaySeconds"]), allow_milliseconds=False)
        except ValueError as exc:
            raise ValidationFailed([FieldError("spec.delay", str(exc))]) from None
        if seconds > MAX_DELAY_SECONDS:
            raise ValidationFailed([FieldError("spec.delay", "must be at most one year")])
        data["delaySeconds"] = int(seconds)
    try:
        request = parse_request(data, prefix="spec.", default_region=default_region)
        return prepare_request(
            request,
            idempotency_key=idempotency_key_for(uid, spec),
            request_digest=request_hash(data),
            now=now,
            source=Source.KUBERNETES,
            field_prefix="spec.",
        )
    except ValidationFailed as exc:
        raise ValidationFailed([_spec_field(e) for e in exc.errors]) from None


def new_notification_from_spec(
    *, namespace: str, uid: str, spec: Mapping[str, Any], now: datetime
) -> NewNotification:
    """The one notification of a plain Notification spec (channel + recipient, body)."""
    p = prepared_from_spec(namespace=namespace, uid=uid, spec=spec, now=now)
    return to_new_notification(
        p.request,
        idempotency_key=p.idempotency_key,
        request_digest=p.request_hash,
        now=now,
        source=Source.KUBERNETES,
        field_prefix="spec.",
    )


def _spec_field(error: FieldError) -> FieldError:
    # The API's names back to the spec's: delaySeconds is delay here.
    return FieldError(error.field.replace("spec.delaySeconds", "spec.delay"), error.message)


def policy_from_spec(
    *, namespace: str, name: str, spec: Mapping[str, Any], webhook_secret: str | None
) -> Policy:
    """The queue's policy for a NotificationPolicy; `webhook_secret` is the Secret's value."""
    errors: list[FieldError] = []

    def seconds(value: object, field: str) -> float | None:
        if value is None:
            return None
        try:
            result = parse_duration_seconds(str(value))
        except ValueError as exc:
            errors.append(FieldError(field, str(exc)))
            return None
        if result <= 0:
            errors.append(FieldError(field, "must be longer than zero"))
        return result

    rate = spec.get("rateLimit") or {}
    retry = spec.get("retry") or {}
    webhook = spec.get("webhook") or {}
    secrets: tuple[str, ...] = ()
    if webhook_secret is not None:
        secrets = tuple(s.strip() for s in webhook_secret.split(",") if s.strip())
        if not secrets or not all(s.startswith("whsec_") for s in secrets):
            errors.append(
                FieldError(
                    "spec.webhook.secretRef", "the Secret's value must look like whsec_<base64>"
                )
            )
    channel_limits: dict[str, ChannelRateLimit] = {}
    for channel, limit in (rate.get("channels") or {}).items():
        field = f"spec.rateLimit.channels.{channel}"
        if channel not in set(Channel):
            errors.append(FieldError(field, f"must be one of {', '.join(Channel)}"))
            continue
        window = seconds((limit or {}).get("window"), f"{field}.window")
        maximum = (limit or {}).get("maxPerWindow")
        if window is None or not isinstance(maximum, int) or maximum < 1:
            errors.append(FieldError(field, "needs maxPerWindow (at least 1) and a window"))
            continue
        channel_limits[channel] = ChannelRateLimit(maximum, window)
    policy = Policy(
        name=policy_name(namespace, name),
        rate_limit=rate.get("maxPerWindow"),
        rate_window_seconds=seconds(rate.get("window"), "spec.rateLimit.window"),
        channel_rate_limits=channel_limits,
        max_attempts=retry.get("maxAttempts"),
        backoff_base_seconds=seconds(retry.get("initialBackoff"), "spec.retry.initialBackoff"),
        backoff_max_seconds=seconds(retry.get("maxBackoff"), "spec.retry.maxBackoff"),
        webhook_url=webhook.get("url"),
        webhook_secrets=secrets,
        ttl_seconds_after_finished=spec.get("ttlSecondsAfterFinished"),
        failover=Failover(spec["failover"]) if spec.get("failover") else None,
        providers=tuple(spec["providers"]) if spec.get("providers") else None,
    )
    if (
        policy.backoff_base_seconds is not None
        and policy.backoff_max_seconds is not None
        and policy.backoff_base_seconds > policy.backoff_max_seconds
    ):
        errors.append(FieldError("spec.retry.initialBackoff", "must not exceed maxBackoff"))
    if errors:
        raise ValidationFailed(errors)
    return policy


def acknowledged_by(annotations: Mapping[str, str]) -> str | None:
    """Who acknowledges when the object carries `notifyqueue.io/acknowledged=true`: the
    `acknowledged-by` annotation if present (at most 255 characters), else "kubernetes"; None
    when the object is not acknowledged."""
    if annotations.get(ACKNOWLEDGED) != "true":
        return None
    by = (annotations.get(ACKNOWLEDGED_BY) or "").strip()
    return by[:255] if by else "kubernetes"


def object_reference(*, kind: str, namespace: str, name: str, uid: str) -> dict[str, str]:
    """What an Event's involvedObject needs to point at one of our objects."""
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "namespace": namespace,
        "name": name,
        "uid": uid,
    }
