"""A Notification's address is normalised by the operator as the API normalises it, on a real
kube-apiserver and PostgreSQL: a national voice number with the operator's --default-region is
stored in E.164 and an email domain IDNA-encoded in lower case; without a region the number is
Rejected with the reason in its status, and nothing is stored (docs/recipients.md, "Addresses").
Voice, not sms: v1alpha1's schema keeps its E.164 rule for sms (CRDs change additively only)."""

from __future__ import annotations

from typing import Any

import pytest

from notify_queue.repositories.db import Database
from tests.operator.conftest import StartOperator
from tests.operator.support import Kube, condition, notification, phase
from tests.support import eventually

pytestmark = pytest.mark.kubernetes


async def _stored_recipient(db: Database, uid: str) -> Any:
    rows = await db.fetch_all("notification_get_by_keys", {"idempotency_keys": [f"k8s:{uid}"]})
    return rows[0]["recipient"] if rows else None


async def _phase(kube: Kube, namespace: str, name: str, wanted: str) -> Any:
    async def reached() -> Any:
        obj = await kube.get("Notification", namespace, name)
        return phase(obj) == wanted and obj

    return await eventually(reached, timeout=20, what=f"{name} {wanted}")


async def test_the_operator_stores_addresses_normalised_with_its_default_region(
    kube: Kube, namespace: str, start_operator: StartOperator, db: Database
) -> None:
    await start_operator(default_region="GB")
    voice = await kube.create(
        notification(namespace, "uk", channel="voice", recipient="020 7946 0958")
    )
    mail = await kube.create(notification(namespace, "mail", recipient="Ann@BÜCHER.Example"))
    await _phase(kube, namespace, "uk", "Pending")
    await _phase(kube, namespace, "mail", "Pending")
    assert await _stored_recipient(db, voice["metadata"]["uid"]) == "+442079460958"
    assert await _stored_recipient(db, mail["metadata"]["uid"]) == "Ann@xn--bcher-kva.example"


async def test_a_national_number_without_a_default_region_is_rejected_with_the_reason(
    kube: Kube, namespace: str, start_operator: StartOperator, db: Database
) -> None:
    await start_operator()
    created = await kube.create(
        notification(namespace, "uk", channel="voice", recipient="020 7946 0958")
    )
    obj = await _phase(kube, namespace, "uk", "Rejected")
    accepted = condition(obj, "Accepted")
    assert accepted is not None and accepted["reason"] == "Invalid"
    assert "spec.recipient" in accepted["message"] and "E.164" in accepted["message"]
    assert await _stored_recipient(db, created["metadata"]["uid"]) is None
