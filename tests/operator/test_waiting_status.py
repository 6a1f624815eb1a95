"""Why a Notification waits, on a real kube-apiserver with the real operator and a worker
(CONTRACT section 10): while it is Pending and waits, `status.waiting` mirrors the API's field,
the `Reconciling` condition's reason is the waiting reason with its detail as the message, and
`kubectl get notif` shows it in the WAITING column; once it is sent, all three are gone."""

from __future__ import annotations

from typing import Any

import pytest

from notify_queue.devcluster import LocalControlPlane
from notify_queue.repositories.db import Database
from tests.operator.support import (
    Kube,
    OperatorThread,
    condition,
    notification,
    phase,
    policy,
    running_worker,
    settings_for,
)
from tests.support import eventually

pytestmark = pytest.mark.kubernetes


async def _waiting(kube: Kube, namespace: str, name: str, reason: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        obj = await kube.get("Notification", namespace, name)
        waiting = ((obj or {}).get("status") or {}).get("waiting") or {}
        return obj if waiting.get("reason") == reason else None

    found: dict[str, Any] = await eventually(check, timeout=30, what=f"{name} waiting {reason}")
    return found


def _waiting_column(control_plane: LocalControlPlane, namespace: str) -> dict[str, str]:
    """NAME -> WAITING of `kubectl get notif` (the real kubectl, the CRD's printer columns),
    read by the header's column positions: an empty cell is blank, not a word."""
    lines = control_plane.kubectl("get", "notif", "-n", namespace).stdout.splitlines()
    start, end = lines[0].index("WAITING"), lines[0].index("AGE")
    return {line.split()[0]: line[start:end].strip() for line in lines[1:]}


def _assert_mirrors(obj: dict[str, Any], reason: str) -> None:
    waiting = obj["status"]["waiting"]
    assert obj["status"]["phase"] == "Pending" and waiting["detail"]
    reconciling = condition(obj, "Reconciling")
    assert reconciling is not None
    assert (reconciling["status"], reconciling["reason"]) == ("True", reason)
    assert reconciling["message"].startswith(waiting["detail"])


async def test_a_scheduled_and_a_rate_limited_notification_say_why_they_wait(
    kube: Kube,
    namespace: str,
    operator: OperatorThread,
    database_url: str,
    db: Database,
    control_plane: LocalControlPlane,
) -> None:
    await kube.create(policy(namespace, "default", rateLimit={"maxPerWindow": 1, "window": "1h"}))

    async def policy_ready() -> bool:
        obj = await kube.get("NotificationPolicy", namespace, "default")
        ready = condition(obj, "Ready")
        return bool(ready and ready["status"] == "True")

    await eventually(policy_ready, what="the default policy Ready")
    await kube.create(notification(namespace, "later", delay="1h"))
    obj = await _waiting(kube, namespace, "later", "Scheduled")
    _assert_mirrors(obj, "Scheduled")
    assert obj["status"]["waiting"]["until"] is not None

    for name in ("first", "second"):
        await kube.create(notification(namespace, name, recipient="busy@example.com"))
    async with running_worker(settings_for(database_url, namespace), db):

        async def one_sent_one_waiting() -> tuple[str, dict[str, Any]] | None:
            objs = {n: await kube.get("Notification", namespace, n) for n in ("first", "second")}
            sent = [n for n, o in objs.items() if phase(o) == "Sent"]
            waits = [
                (n, o)
                for n, o in objs.items()
                if ((o or {}).get("status") or {}).get("waiting", {}).get("reason")
                == "RecipientRateLimit"
            ]
            return waits[0] if len(sent) == 1 and len(waits) == 1 else None

        name, obj = await eventually(one_sent_one_waiting, timeout=30, what="one Sent, one waits")
        _assert_mirrors(obj, "RecipientRateLimit")
        sent_name = "second" if name == "first" else "first"
        sent = await kube.get("Notification", namespace, sent_name)
        assert sent is not None and "waiting" not in sent["status"]

        columns = _waiting_column(control_plane, namespace)
        assert columns["later"] == "Scheduled" and columns[name] == "RecipientRateLimit"
        assert columns[sent_name] == ""
