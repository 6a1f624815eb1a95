"""What a Notification's or NotificationPolicy's `.status` says, as pure functions of the row.

Conditions follow the Kubernetes API conventions and kstatus (sigs.k8s.io/cli-utils), which is
what Flux (`wait: true`, health checks), `kubectl wait` and most GitOps tooling read:

- `Ready`: the object reached the outcome it was created for.
- `Reconciling` (abnormal-true): work is in progress: waiting, scheduled, being delivered, a
  retry scheduled, or held until its NotificationPolicy is Ready.
- `Stalled` (abnormal-true): it cannot succeed without a change by a person.

Exactly one of the three is True at any time. The table (docs/operator.md, "Conditions"):

| phase                          | Ready | Reconciling | Stalled | kstatus    |
|--------------------------------|-------|-------------|---------|------------|
| Pending, Processing            | False | True        | False   | InProgress |
| Sent                           | True  | False       | False   | Current    |
| Cancelled, Suppressed          | True  | False       | False   | Current    |
| Failed, DeadLettered, Expired  | False | False       | True    | Failed     |
| Rejected                       | False | False       | True    | Failed     |

Cancelled and Suppressed are deliberate final outcomes, not faults: someone cancelled the
notification, or the recipient's preferences say not to send it. Nothing about the object can be
fixed, and a GitOps pipeline that holds such an object must not stay red until someone deletes
it from Git, so they count as done (Ready=True, with the phase as the reason). `Delivered` says
whether it was actually sent: `kubectl wait --for=condition=Delivered` waits for sending only.

Every `lastTransitionTime` is derived from the row, not from the time of writing, so it changes
only when that condition's status changes, however often the status is written: a condition that
turned when the current delivery began (creation, or the latest operator retry) carries that
moment; one that turned when the notification finished carries `finished_at`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from notify_queue.models import Notification, Status, Waiting
from notify_queue.services.kube import DEFAULT_POLICY, PHASES, REJECTED

# Final phases that count as done (see the module docstring): Ready=True, not Stalled.
DELIBERATE_OUTCOMES = frozenset({"Sent", "Cancelled", "Suppressed"})
# Final phases that need a person: Stalled=True.
STALLED_PHASES = frozenset({"Failed", "DeadLettered", "Expired", REJECTED})
POLICY_NOT_READY = "PolicyNotReady"


def kube_time(moment: datetime) -> str:
    """RFC 3339 in UTC with seconds, as Kubernetes writes its own times."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _precise_time(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def condition(
    type: str,
    status: str,
    reason: str,
    message: str,
    *,
    at: datetime,
    generation: int | None,
    previous: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A status condition; keeps the previous lastTransitionTime when its status did not change."""
    transition = kube_time(at)
    for old in previous:
        if (
            old.get("type") == type
            and old.get("status") == status
            and old.get("lastTransitionTime")
        ):
            transition = str(old["lastTransitionTime"])
    result: dict[str, Any] = {
        "type": type,
        "status": status,
        "reason": reason,
        "message": message[:1024],
        "lastTransitionTime": transition,
    }
    if generation is not None:
        result["observedGeneration"] = generation
    return result


def _waiting(w: Waiting | None) -> dict[str, Any] | None:
    """`status.waiting`: the API's `waiting` field (docs/design.md), or None (cleared)."""
    if w is None:
        return None
    return {"reason": w.reason.value, "until": _precise_time(w.until), "detail": w.detail}


def _attempts(n: Notification) -> str:
    return f"{n.attempt_count} attempt{'s' if n.attempt_count != 1 else ''}"


def _progress(n: Notification, *, policy_ready: bool) -> tuple[str, str]:
    """(reason, message) of a notification still in progress (Reconciling=True). While it waits
    (docs/design.md, "Why a notification waits") the reason is why it waits and the message its
    one-sentence detail; due and waiting only for a worker, `Waiting` (never tried) or
    `RetryScheduled`."""
    due = kube_time(n.next_attempt_at)
    if n.status is Status.PROCESSING:
        return "Delivering", f"attempt {n.attempt_count} in progress"
    if n.waiting is not None:
        until = "" if n.waiting.until is None else f" (until {kube_time(n.waiting.until)})"
        return n.waiting.reason.value, f"{n.waiting.detail}{until}"
    if not policy_ready:
        return POLICY_NOT_READY, (
            f"held until NotificationPolicy {n.policy} is Ready (it is not sent under the "
            f"defaults); next check at {due}"
        )
    if n.attempt_count == 0:
        return "Waiting", f"due at {due}"
    return "RetryScheduled", f"{_attempts(n)} so far ({n.last_error}); next at {due}"


def _outcome(n: Notification, phase: str) -> tuple[str, str]:
    """(reason, message) of a final notification."""
    if phase == "Sent":
        return "Sent", f"delivered after {_attempts(n)}"
    if phase == "Failed":
        return "PermanentFailure", n.last_error or "the provider refused it"
    if phase == "DeadLettered":
        return "DeadLettered", f"gave up after {_attempts(n)}: {n.last_error}"
    if phase == "Cancelled":
        return "Cancelled", "cancelled before it was sent"
    if phase == "Expired":
        return "Expired", n.last_error or "expired before it could be sent"
    return phase, n.last_error or phase.lower()


def _accepted(n: Notification, policy_exists: bool) -> str:
    namespace, _, policy = (n.policy or "").partition("/")
    if policy_exists or not policy or policy == DEFAULT_POLICY:
        return f"enqueued as notification {n.id}"
    return (
        f"enqueued as notification {n.id}; NotificationPolicy {policy!r} does not exist in "
        f"namespace {namespace}, so the workers' defaults apply until it does"
    )


def notification_status(
    notification: Notification,
    *,
    generation: int | None,
    finished_at: datetime | None = None,
    policy_ready: bool = True,
    policy_exists: bool = True,
    related: Sequence[uuid.UUID] = (),
    escalation: tuple[uuid.UUID, str] | None = None,
) -> dict[str, Any]:
    """The `.status` of a Notification object whose row is `notification` (a merge patch).

    `finished_at`: when the row reached its final status (the row's column; the last update if
    unknown). `policy_ready`: False while the row's NotificationPolicy exists but is not Ready.
    `policy_exists`: False when it does not exist; for a policy the object named (not the
    `default` it falls back to) the Accepted condition then says the defaults apply.
    `related`: every row a recipientId request became (docs/operator.md), as status.notifications;
    the phase and conditions follow `notification`, the first of them.
    `escalation`: (id, state) of a spec.escalation object, as status.escalation; its `related`
    are the steps in order and `notification` is the last step (docs/escalation.md).
    """
    n = notification
    phase = PHASES[n.status]
    # The current delivery began at creation, or at the latest operator retry.
    started = n.retries[-1].at if n.retries else n.created_at
    final = n.status.is_final
    ended = finished_at or n.updated_at

    def cond(type: str, status: str, reason: str, message: str, at: datetime) -> dict[str, Any]:
        return condition(type, status, reason, message, at=at, generation=generation)

    if final:
        reason, message = _outcome(n, phase)
        done = phase in DELIBERATE_OUTCOMES
        stalled = not done
        sent = "True" if phase == "Sent" else "False"
        delivered = cond("Delivered", sent, reason, message, ended)
        if n.delivery is not None:
            # The provider's receipt (docs/receipts.md): Delivered, Bounced or Complained.
            said = n.delivery.state.capitalize()
            delivered = cond(
                "Delivered",
                "True" if n.delivery.state == "delivered" else "False",
                said,
                f"{said} per the provider"
                + (f": {n.delivery.reason}" if n.delivery.reason else ""),
                n.delivery.at,
            )
        ready_at = ended if done else n.created_at  # False since creation: it never was True
        ready = cond("Ready", "True" if done else "False", reason, message, ready_at)
        reconciling = cond("Reconciling", "False", reason, f"finished: {phase}", ended)
        stalled_c = cond(
            "Stalled",
            "True" if stalled else "False",
            reason,
            message if stalled else f"finished: {phase}",
            ended if stalled else started,
        )
    else:
        reason, message = _progress(n, policy_ready=policy_ready)
        delivered = cond("Delivered", "Unknown", reason, message, started)
        ready = cond("Ready", "False", reason, message, n.created_at)
        reconciling = cond("Reconciling", "True", reason, message, started)
        stalled_c = cond("Stalled", "False", reason, "in progress", started)
    return {
        "phase": phase,
        "notificationId": str(n.id),
        "notifications": [str(i) for i in related] or None,
        "attempts": n.attempt_count,
        # None clears the field in a merge patch (a retried notification has no error any more).
        "lastError": n.last_error,
        "sentAt": _precise_time(n.sent_at),
        "delivery": None
        if n.delivery is None
        else {
            "state": n.delivery.state,
            "at": _precise_time(n.delivery.at),
            "reason": n.delivery.reason,
        },
        "nextAttemptAt": _precise_time(n.next_attempt_at) if n.status is Status.PENDING else None,
        # The API's `waiting`, the same shape; None clears it in the merge patch once it is due.
        "waiting": _waiting(n.waiting),
        "escalation": (
            None if escalation is None else {"id": str(escalation[0]), "state": escalation[1]}
        ),
        "observedGeneration": generation,
        "conditions": [
            cond("Accepted", "True", "Enqueued", _accepted(n, policy_exists), n.created_at),
            delivered,
            ready,
            reconciling,
            stalled_c,
        ],
    }


def rejected_status(
    *, reason: str, message: str, generation: int | None, now: datetime
) -> dict[str, Any]:
    """The `.status` of a Notification the queue did not accept (no row was stored): Stalled."""
    return {
        "phase": REJECTED,
        "observedGeneration": generation,
        "conditions": [
            condition(type, status, reason, message, at=now, generation=generation)
            for type, status in (
                ("Accepted", "False"),
                ("Ready", "False"),
                ("Reconciling", "False"),
                ("Stalled", "True"),
            )
        ],
    }


def policy_status(
    *,
    ready: bool,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
    previous: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A NotificationPolicy's `.status`: Ready, or Stalled (its Secret or spec needs fixing).

    Mirroring is one synchronous step, so Reconciling is always False; the previous conditions
    keep each lastTransitionTime while its status holds.
    """
    return {
        "observedGeneration": generation,
        "conditions": [
            condition(
                type, status, reason, message, at=now, generation=generation, previous=previous
            )
            for type, status in (
                ("Ready", "True" if ready else "False"),
                ("Reconciling", "False"),
                ("Stalled", "False" if ready else "True"),
            )
        ],
    }


def template_status(
    *,
    ready: bool,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
    version: int | None,
    name: str,
    previous: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The `.status` of a NotificationTemplate: Ready, and the mirrored version and name."""
    status = policy_status(
        ready=ready,
        reason=reason,
        message=message,
        generation=generation,
        now=now,
        previous=previous,
    )
    status["templateName"] = name
    if version is not None:
        status["version"] = version
    return status
