"""A Notification's waiting status follows time and the workers, on a real kube-apiserver with the
real operator and real workers (docs/design.md "Why a notification waits"): when its reason's
`until` passes without any write of its row, `status.waiting` is written again; a due
notification whose channel and lane no live worker serves (worker heartbeats) waits `NoWorker`
in the API, in `status.waiting`, in the Reconciling condition and in the gauge's count, and stops
once a worker serving it starts (it is sent)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from notify_queue.models import Channel, Status, WaitingReason
from notify_queue.repositories.db import Database
from notify_queue.repositories.notifications import NotificationRepository
from notify_queue.services.notifications import NotificationService
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


async def _waiting_reason(kube: Kube, namespace: str, name: str) -> str | None:
    obj = await kube.get("Notification", namespace, name)
    waiting = ((obj or {}).get("status") or {}).get("waiting") or {}
    return waiting.get("reason")


async def test_a_reason_whose_until_passed_is_refreshed_and_no_worker_is_said(
    kube: Kube, namespace: str, operator: OperatorThread, database_url: str, db: Database
) -> None:
    api = NotificationService(NotificationRepository(db), default_max_attempts=3)
    # A worker that serves sms only: alive (its heartbeat), but not for email.
    sms_only = settings_for(database_url, namespace, channels=[Channel.SMS])
    async with running_worker(sms_only, db):
        await kube.create(notification(namespace, "soon", delay="3s"))

        async def scheduled() -> bool:
            return await _waiting_reason(kube, namespace, "soon") == "Scheduled"

        await eventually(scheduled, what="soon waiting Scheduled")
        obj = await kube.get("Notification", namespace, "soon")
        assert obj is not None
        notification_id = uuid.UUID(obj["status"]["notificationId"])

        # Nothing writes the row when its send time comes (no worker claims email): only the
        # operator's look at `until` can change what the object says.
        async def no_worker() -> bool:
            return await _waiting_reason(kube, namespace, "soon") == "NoWorker"

        await eventually(no_worker, timeout=30, what="soon waiting NoWorker after its until")
        obj = await kube.get("Notification", namespace, "soon")
        waiting: dict[str, Any] = obj["status"]["waiting"] if obj else {}
        assert waiting.get("until") is None
        assert "email" in waiting["detail"] and "NORMAL" in waiting["detail"]
        reconciling = condition(obj, "Reconciling")
        assert reconciling is not None and reconciling["reason"] == "NoWorker"

        # The API says the same, lists it under ?waiting=NoWorker and counts it in the gauge.
        got = await api.get(notification_id)
        assert got.status is Status.PENDING
        assert got.waiting is not None and got.waiting.reason is WaitingReason.NO_WORKER
        listed, _ = await api.list(waiting=WaitingReason.NO_WORKER)
        assert [n.id for n in listed] == [notification_id]
        status = await api.status(waiting=True)
        assert status.waiting[WaitingReason.NO_WORKER] == 1

        # A worker that serves email starts: the notification is no longer NoWorker (sent).
        async with running_worker(settings_for(database_url, namespace), db):

            async def sent() -> bool:
                return phase(await kube.get("Notification", namespace, "soon")) == "Sent"

            await eventually(sent, timeout=30, what="soon Sent once an email worker runs")
        obj = await kube.get("Notification", namespace, "soon")
        assert obj is not None and "waiting" not in obj["status"]
        assert (await api.get(notification_id)).waiting is None


async def test_a_notification_no_worker_serves_says_so_and_stops_when_one_starts(
    kube: Kube, namespace: str, operator: OperatorThread, database_url: str, db: Database
) -> None:
    """No worker at all, then a worker for other lanes only, then one for its lane: the status
    follows the heartbeats, without any write of the notification's row."""
    api = NotificationService(NotificationRepository(db), default_max_attempts=3)
    await kube.create(notification(namespace, "now", priority="HIGH"))

    async def no_worker() -> bool:
        return await _waiting_reason(kube, namespace, "now") == "NoWorker"

    await eventually(no_worker, timeout=30, what="now waiting NoWorker")
    obj = await kube.get("Notification", namespace, "now")
    assert obj is not None
    got = await api.get(uuid.UUID(obj["status"]["notificationId"]))
    assert got.waiting is not None and got.waiting.reason is WaitingReason.NO_WORKER

    low_lanes = settings_for(database_url, namespace, priorities=["LOW"])
    async with running_worker(low_lanes, db):
        high_lane = settings_for(database_url, namespace, priorities=["HIGH"])
        async with running_worker(high_lane, db):

            async def sent() -> bool:
                return phase(await kube.get("Notification", namespace, "now")) == "Sent"

            await eventually(sent, timeout=30, what="now Sent once a HIGH worker runs")
        assert await _waiting_reason(kube, namespace, "now") is None
