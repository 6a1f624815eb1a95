"""A row's status as conditions (`services.kube_status`), on its own: the kstatus table per phase
(exactly one of Ready / Reconciling / Stalled True), reasons, observedGeneration on every
condition, and lastTransitionTime derived from the row so that it holds across retries.
No cluster, no database; tests/operator/test_gitops.py checks the same on a live API server
with the real kstatus library."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from notify_queue.kubectl.why import build_report, render
from notify_queue.models import Channel, Delivery, Notification, Priority, Retry, Source, Status
from notify_queue.services.kube_status import notification_status, policy_status, rejected_status

NOW = datetime(2026, 9, 24, 12, 0, tzinfo=UTC)


def _row(status: Status, **fields: object) -> Notification:
    values: dict[str, object] = {
        "id": uuid.UUID(int=7),
        "idempotency_key": "k",
        "channel": Channel.EMAIL,
        "recipient": "a@example.com",
        "subject": None,
        "body": "hi",
        "priority": Priority.NORMAL,
        "status": status,
        "send_at": NOW,
        "next_attempt_at": NOW + timedelta(seconds=30),
        "expires_at": None,
        "attempt_count": 0,
        "max_attempts": 6,
        "last_error": None,
        "sent_at": None,
        "provider_message_id": None,
        "retries": [],
        "source": Source.KUBERNETES,
        "policy": None,
        "webhook_url": None,
        "metadata": {},
        "created_at": NOW,
        "updated_at": NOW,
    }
    values.update(fields)
    return Notification(**values)  # type: ignore[arg-type]


def _conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


# phase -> (Ready, Reconciling, Stalled, Delivered, reason of Ready)
MATRIX = [
    (Status.PENDING, 0, ("False", "True", "False", "Unknown", "Waiting")),
    (Status.PENDING, 2, ("False", "True", "False", "Unknown", "RetryScheduled")),
    (Status.PROCESSING, 1, ("False", "True", "False", "Unknown", "Delivering")),
    (Status.SENT, 1, ("True", "False", "False", "True", "Sent")),
    (Status.CANCELLED, 0, ("True", "False", "False", "False", "Cancelled")),
    (Status.FAILED, 1, ("False", "False", "True", "False", "PermanentFailure")),
    (Status.DEAD_LETTERED, 6, ("False", "False", "True", "False", "DeadLettered")),
    (Status.EXPIRED, 0, ("False", "False", "True", "False", "Expired")),
]
# Suppressed (issue 12: the recipient opted out) is a deliberate outcome like Cancelled; the row
# joins the matrix as soon as the status exists.
if (suppressed := getattr(Status, "SUPPRESSED", None)) is not None:
    MATRIX.append((suppressed, 0, ("True", "False", "False", "False", "Suppressed")))


@pytest.mark.parametrize(("status", "attempts", "expected"), MATRIX)
def test_each_phase_has_exactly_one_of_ready_reconciling_stalled(
    status: Status, attempts: int, expected: tuple[str, ...]
) -> None:
    result = notification_status(
        _row(status, attempt_count=attempts, last_error="boom"), generation=3
    )
    c = _conditions(result)
    got = (
        c["Ready"]["status"],
        c["Reconciling"]["status"],
        c["Stalled"]["status"],
        c["Delivered"]["status"],
        c["Ready"]["reason"],
    )
    assert got == expected
    assert [c[t]["status"] for t in ("Ready", "Reconciling", "Stalled")].count("True") == 1
    assert c["Accepted"]["status"] == "True"
    assert all(cond["observedGeneration"] == 3 for cond in result["conditions"])
    assert (result["nextAttemptAt"] is not None) == (status is Status.PENDING)


def test_every_status_is_in_the_matrix() -> None:
    assert {s for s, _, _ in MATRIX} == set(Status)


def test_a_rejected_notification_is_stalled_and_not_accepted() -> None:
    status = rejected_status(
        reason="Invalid", message="spec.metadata: too big", generation=1, now=NOW
    )
    assert status["phase"] == "Rejected"
    c = _conditions(status)
    assert {t: c[t]["status"] for t in c} == {
        "Accepted": "False",
        "Ready": "False",
        "Reconciling": "False",
        "Stalled": "True",
    }
    assert c["Stalled"] == {
        "type": "Stalled",
        "status": "True",
        "reason": "Invalid",
        "message": "spec.metadata: too big",
        "lastTransitionTime": "2026-09-24T12:00:00Z",
        "observedGeneration": 1,
    }


def test_transition_times_hold_across_three_retries() -> None:
    """Pending -> Processing -> Pending (retry scheduled) three times: no time moves."""
    first = notification_status(_row(Status.PENDING), generation=1)
    seen = [first]
    for attempt in (1, 2, 3):
        later = NOW + timedelta(minutes=attempt)
        seen.append(
            notification_status(
                _row(Status.PROCESSING, attempt_count=attempt, updated_at=later), generation=1
            )
        )
        seen.append(
            notification_status(
                _row(
                    Status.PENDING,
                    attempt_count=attempt,
                    last_error="503",
                    next_attempt_at=later + timedelta(seconds=30),
                    updated_at=later + timedelta(seconds=1),
                ),
                generation=1,
            )
        )
    times = {(c["type"], c["lastTransitionTime"]) for status in seen for c in status["conditions"]}
    assert times == {
        (t, "2026-09-24T12:00:00Z")
        for t in ("Accepted", "Delivered", "Ready", "Reconciling", "Stalled")
    }
    # The reason and message do change: the latest retry is what a person wants to read.
    assert _conditions(seen[-1])["Reconciling"]["reason"] == "RetryScheduled"


def test_finishing_moves_only_the_conditions_that_turned() -> None:
    finished = NOW + timedelta(minutes=5)
    sent = notification_status(
        _row(Status.SENT, attempt_count=2, sent_at=finished, updated_at=finished),
        generation=1,
        finished_at=finished,
    )
    c = _conditions(sent)
    assert c["Ready"]["lastTransitionTime"] == "2026-09-24T12:05:00Z"
    assert c["Reconciling"]["lastTransitionTime"] == "2026-09-24T12:05:00Z"
    assert c["Delivered"]["lastTransitionTime"] == "2026-09-24T12:05:00Z"
    assert c["Stalled"]["lastTransitionTime"] == "2026-09-24T12:00:00Z"  # False all along
    assert c["Accepted"]["lastTransitionTime"] == "2026-09-24T12:00:00Z"


def test_an_operator_retry_starts_a_new_delivery_from_the_retry_moment() -> None:
    retried = NOW + timedelta(hours=1)
    status = notification_status(
        _row(Status.PENDING, retries=[Retry(retried, Status.DEAD_LETTERED)], updated_at=retried),
        generation=1,
    )
    c = _conditions(status)
    assert c["Reconciling"]["lastTransitionTime"] == "2026-09-24T13:00:00Z"
    assert c["Stalled"]["lastTransitionTime"] == "2026-09-24T13:00:00Z"
    assert c["Ready"]["lastTransitionTime"] == "2026-09-24T12:00:00Z"  # never was True


def test_a_notification_held_by_its_policy_is_reconciling_with_policy_not_ready() -> None:
    status = notification_status(
        _row(Status.PENDING, policy="shop/strict"), generation=1, policy_ready=False
    )
    c = _conditions(status)
    assert (c["Reconciling"]["status"], c["Reconciling"]["reason"]) == ("True", "PolicyNotReady")
    assert "shop/strict" in c["Reconciling"]["message"]
    assert c["Ready"]["status"] == "False"


def test_a_named_policy_that_does_not_exist_is_said_in_the_accepted_condition() -> None:
    missing = _conditions(
        notification_status(
            _row(Status.PENDING, policy="shop/strict"), generation=1, policy_exists=False
        )
    )
    assert missing["Accepted"]["status"] == "True"
    assert "'strict' does not exist in namespace shop" in missing["Accepted"]["message"]
    # The `default` policy applies only when it exists: its absence is no news.
    fallback = _conditions(
        notification_status(
            _row(Status.PENDING, policy="shop/default"), generation=1, policy_exists=False
        )
    )
    assert "does not exist" not in fallback["Accepted"]["message"]


def test_a_policy_is_ready_or_stalled_and_keeps_its_transition_times() -> None:
    earlier = policy_status(ready=True, reason="Mirrored", message="m", generation=1, now=NOW)
    later = policy_status(
        ready=True,
        reason="Mirrored",
        message="m",
        generation=2,
        now=NOW + timedelta(hours=1),
        previous=earlier["conditions"],
    )
    c = _conditions(later)
    assert (c["Ready"]["status"], c["Stalled"]["status"]) == ("True", "False")
    assert c["Ready"]["lastTransitionTime"] == "2026-09-24T12:00:00Z"
    assert later["observedGeneration"] == 2 and c["Ready"]["observedGeneration"] == 2
    broken = policy_status(
        ready=False,
        reason="SecretNotFound",
        message="m",
        generation=2,
        now=NOW + timedelta(hours=1),
        previous=later["conditions"],
    )
    c = _conditions(broken)
    assert (c["Ready"]["status"], c["Stalled"]["status"]) == ("False", "True")
    assert c["Ready"]["lastTransitionTime"] == "2026-09-24T13:00:00Z"
    assert c["Stalled"]["reason"] == "SecretNotFound"
    assert c["Reconciling"]["lastTransitionTime"] == "2026-09-24T12:00:00Z"


@pytest.mark.parametrize(
    ("state", "delivered", "reason"),
    [("delivered", "True", "Delivered"), ("bounced", "False", "Bounced")],
)
def test_a_receipt_shows_as_delivery_and_in_the_delivered_condition(
    state: str, delivered: str, reason: str
) -> None:
    at = NOW + timedelta(minutes=3)
    row = _row(
        Status.SENT,
        sent_at=NOW,
        delivery=Delivery(state, at, "550 user unknown" if state == "bounced" else None),
    )

    status = notification_status(row, generation=1, finished_at=NOW)

    assert status["phase"] == "Sent"
    assert status["delivery"]["state"] == state
    assert status["delivery"]["at"] == "2026-09-24T12:03:00.000000Z"
    condition = _conditions(status)["Delivered"]
    assert (condition["status"], condition["reason"]) == (delivered, reason)
    assert condition["lastTransitionTime"] == "2026-09-24T12:03:00Z"
    assert _conditions(status)["Ready"]["status"] == "True"  # sent is done, whatever came after


def test_kubectl_notify_why_says_what_the_provider_reported() -> None:
    obj = {
        "metadata": {"name": "welcome", "namespace": "shop"},
        "spec": {"channel": "email", "recipient": "a@example.com"},
        "status": {
            "phase": "Sent",
            "delivery": {"state": "bounced", "at": "2026-09-24T12:03:00Z", "reason": "550"},
        },
    }
    policy = {"name": "default", "found": False, "note": "none"}

    report = build_report(obj, policy=policy, api=None, api_note="not asked")

    assert report["delivery"]["state"] == "bounced"
    assert "Delivery" in render(report) and "bounced" in render(report)
