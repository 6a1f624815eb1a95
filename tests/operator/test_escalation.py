"""Escalation in Kubernetes (CONTRACT section 10, docs/escalation.md "Kubernetes"), against the
suite's real kube-apiserver, the real operator and a real worker: a Notification with
spec.escalation becomes an escalation (one row per step) through the service the API uses; its
first step is sent while later ones wait; `kubectl notify ack` (the plugin through the real
kubectl) annotates it, the operator acknowledges the escalation, the steps not yet sent are
CANCELLED with lastError `acknowledged` and status.escalation.state becomes acknowledged. A
restarted operator leaves the settled object alone, and nothing is created twice. Bad specs are
refused by the schema or Rejected by the operator with the field named."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from notify_queue.devcluster import LocalControlPlane
from notify_queue.repositories.db import Database
from notify_queue.repositories.recipients import RecipientRepository
from notify_queue.services.recipients import RecipientService
from tests.api.support import sql
from tests.operator.conftest import StartOperator
from tests.operator.support import (
    GROUP_VERSION,
    Kube,
    OperatorThread,
    condition,
    phase,
    running_worker,
    settings_for,
)
from tests.support import eventually

pytestmark = pytest.mark.kubernetes

PLUGIN_DIR = Path(sys.executable).parent
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "08-escalation" / "db-down.yaml"
STEPS = [
    {"channel": "push", "afterSeconds": 0},
    {"channel": "sms", "afterSeconds": 30},
    {"channel": "voice", "afterSeconds": 60},
]


def manifest(namespace: str, name: str, spec: dict[str, Any]) -> str:
    return json.dumps(
        {
            "apiVersion": GROUP_VERSION,
            "kind": "Notification",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
    )


def page(steps: list[dict[str, Any]] = STEPS, **extra: Any) -> dict[str, Any]:
    spec = {"recipientId": "oncall-ana", "body": "db-1 is down", "escalation": {"steps": steps}}
    return spec | extra


async def kubectl_notify(
    cluster: LocalControlPlane, *args: str
) -> subprocess.CompletedProcess[str]:
    """`kubectl notify ...`: the plugin found on PATH by the real kubectl."""
    env = dict(os.environ)
    env["KUBECONFIG"] = str(cluster.kubeconfig_for("admin"))
    env["PATH"] = f"{PLUGIN_DIR}{os.pathsep}{env.get('PATH', '')}"
    command = [str(cluster.bin_dir / "kubectl"), "notify", *args]
    return await asyncio.to_thread(
        subprocess.run, command, env=env, capture_output=True, text=True, timeout=120
    )


ACK = "notifyqueue.io/acknowledged"


async def handled(caplog: pytest.LogCaptureFixture, old: str, new: str) -> bool:
    """kopf handled the annotation's change from `old` to `new`: its DEBUG line with the diff
    (kopf's bookkeeping is in the operator's memory, not on the object)."""
    change = f"('change', ('metadata', 'annotations', '{ACK}'), '{old}', '{new}')"
    return any(
        r.name == "kopf.objects" and "diff:" in r.getMessage() and change in r.getMessage()
        for r in caplog.records
    )


async def steps_of(database_url: str, escalation_id: str) -> list[tuple[str, str, str | None]]:
    """(channel, status, lastError) of each step, in step order."""
    rows = await sql(
        database_url,
        "SELECT n.channel, n.status, n.last_error FROM nq_escalations e"
        " CROSS JOIN LATERAL unnest(e.step_ids) WITH ORDINALITY AS s(id, position)"
        " JOIN nq_all_notifications n ON n.id = s.id"
        " WHERE e.id = %s ORDER BY s.position",
        (escalation_id,),
    )
    return [(r[0], r[1], r[2]) for r in rows]


async def test_an_escalation_is_mirrored_sent_step_by_step_and_acknowledged_by_kubectl_notify_ack(
    control_plane: LocalControlPlane,
    kube: Kube,
    namespace: str,
    operator: OperatorThread,
    start_operator: StartOperator,
    db: Database,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="kopf.objects")
    recipients = RecipientService(RecipientRepository(db))
    await recipients.put("oncall-ana", {"phone": "+4915112345678", "pushTokens": ["device-1"]})
    # The example's manifest (its steps: push at 0, sms at 30, voice at 60 seconds).
    control_plane.kubectl("apply", "-n", namespace, "-f", str(EXAMPLE))

    async with running_worker(settings_for(database_url, namespace), db):

        async def first_step_sent() -> Any:
            obj = await kube.get("Notification", namespace, "db-down")
            status = (obj or {}).get("status") or {}
            escalation = status.get("escalation") or {}
            if escalation.get("state") != "active":
                return None
            steps = await steps_of(database_url, escalation["id"])
            return steps[0][1] == "SENT" and (obj, steps)

        obj, steps = await eventually(first_step_sent, timeout=30, what="first step SENT")
    status = obj["status"]
    assert [s[:2] for s in steps] == [("push", "SENT"), ("sms", "PENDING"), ("voice", "PENDING")]
    # One notification per step, listed in order; the phase follows the last step: Pending,
    # waiting for its time.
    assert len(status["notifications"]) == 3
    assert status["notificationId"] == status["notifications"][-1]
    assert phase(obj) == "Pending"
    assert status["waiting"]["reason"] == "EscalationStep"
    reconciling = condition(obj, "Reconciling")
    assert reconciling is not None and reconciling["reason"] == "EscalationStep"
    assert "step 3 of 3 (voice)" in reconciling["message"]
    escalation_id = status["escalation"]["id"]

    acked = await kubectl_notify(control_plane, "ack", "db-down", "-n", namespace)
    assert acked.returncode == 0, acked.stderr
    assert acked.stdout == (
        f"notification.notifyqueue.io/db-down acknowledged (escalation {escalation_id})\n"
    )

    async def acknowledged() -> Any:
        got = await kube.get("Notification", namespace, "db-down")
        state = (((got or {}).get("status") or {}).get("escalation") or {}).get("state")
        return state == "acknowledged" and phase(got) == "Cancelled" and got

    obj = await eventually(acknowledged, timeout=20, what="status.escalation acknowledged")
    assert obj["status"]["lastError"] == "acknowledged"
    assert await steps_of(database_url, escalation_id) == [
        ("push", "SENT", None),
        ("sms", "CANCELLED", "acknowledged"),
        ("voice", "CANCELLED", "acknowledged"),
    ]
    # By: who ran the plugin, as the API server knows them (the test's admin certificate).
    ((by,),) = await sql(
        database_url, "SELECT acknowledged_by FROM nq_escalations WHERE id = %s", (escalation_id,)
    )
    assert by == "admin"
    reasons = [e["reason"] for e in await kube.events(namespace, name="db-down")]
    assert reasons.count("Acknowledged") == 1

    # Again: the plugin says so and changes nothing; another update of the object re-runs the
    # handler, which is harmless (the first acknowledgement's time and author stay).
    again = await kubectl_notify(control_plane, "ack", "db-down", "-n", namespace)
    assert again.stdout.endswith("already acknowledged (escalation " + escalation_id + ")\n")
    control_plane.kubectl("label", "notif", "db-down", "-n", namespace, "touched=yes")

    # A restarted operator starts with nothing remembered; the object is settled (its phase
    # final, its escalation acknowledged), so it has nothing to mirror again and keeps nothing
    # for it (operator/storage.py): taking the annotation back and giving it again, by somebody
    # else, runs no handler and changes nothing.
    await operator.stop()
    restarted_at = len(caplog.records)
    await start_operator()

    def seen_unchanged(times: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return times <= sum(
                1
                for r in caplog.records[restarted_at:]
                if getattr(r, "k8s_ref", {}).get("name") == "db-down"
                and "the essence is the same" in r.getMessage()
            )

        return check

    ns = ("-n", namespace, "--overwrite")
    control_plane.kubectl("annotate", "notif", "db-down", *ns, f"{ACK}=false", f"{ACK}-by=eve")
    await eventually(seen_unchanged(1), timeout=30, what="the change to false seen")
    control_plane.kubectl("annotate", "notif", "db-down", *ns, f"{ACK}=true")
    await eventually(seen_unchanged(2), timeout=30, what="the change to true seen")
    restarted = caplog.records[restarted_at:]
    assert not [
        r
        for r in restarted
        if getattr(r, "k8s_ref", {}).get("name") == "db-down"
        and ("is processed" in r.getMessage() or "diff:" in r.getMessage())
    ]
    counts = await sql(
        database_url,
        "SELECT (SELECT count(*) FROM nq_escalations WHERE recipient_id = 'oncall-ana'),"
        " (SELECT count(*) FROM nq_all_notifications WHERE recipient_id = 'oncall-ana'),"
        " (SELECT acknowledged_by FROM nq_escalations WHERE id = %s)",
        (escalation_id,),
    )
    assert counts == [(1, 3, "admin")]


async def test_annotated_at_creation_is_acknowledged_and_deleted_cancels_every_step(
    control_plane: LocalControlPlane,
    kube: Kube,
    namespace: str,
    operator: OperatorThread,
    db: Database,
    database_url: str,
) -> None:
    """No worker runs: nothing is sent. `pre-acked` carries the annotation before the operator
    first mirrors it: kopf reports no change of it later, so the create handler acknowledges.
    `gone` is deleted while every step is PENDING: all are cancelled (as a recipientId object's
    channels), not only the linked last one."""
    recipients = RecipientService(RecipientRepository(db))
    await recipients.put("oncall-ana", {"phone": "+4915112345678", "pushTokens": ["device-1"]})
    body = json.loads(manifest(namespace, "pre-acked", page()))
    body["metadata"]["annotations"] = {"notifyqueue.io/acknowledged": "true"}
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(body))
    control_plane.kubectl("apply", "-f", "-", input=manifest(namespace, "gone", page()))

    async def mirrored() -> Any:
        got = await kube.get("Notification", namespace, "gone")
        return (((got or {}).get("status") or {}).get("escalation") or {}).get("id")

    gone_id = await eventually(mirrored, timeout=20, what="mirrored")
    await kube.delete("Notification", namespace, "gone")

    async def cancelled() -> Any:
        steps = await steps_of(database_url, gone_id)
        return {s[1] for s in steps} == {"CANCELLED"} and steps

    steps = await eventually(cancelled, timeout=20, what="steps cancelled")
    assert [s[0] for s in steps] == ["push", "sms", "voice"]

    async def acknowledged() -> Any:
        got = await kube.get("Notification", namespace, "pre-acked")
        escalation = ((got or {}).get("status") or {}).get("escalation") or {}
        return escalation.get("state") == "acknowledged" and phase(got) == "Cancelled" and got

    obj = await eventually(acknowledged, timeout=20, what="acknowledged at creation")
    steps = await steps_of(database_url, obj["status"]["escalation"]["id"])
    assert {s[1:] for s in steps} == {("CANCELLED", "acknowledged")}
    ((by,),) = await sql(
        database_url,
        "SELECT acknowledged_by FROM nq_escalations WHERE id = %s",
        (obj["status"]["escalation"]["id"],),
    )
    assert by == "kubernetes"


async def test_bad_escalations_are_refused_by_the_schema_or_rejected_with_the_field(
    control_plane: LocalControlPlane,
    kube: Kube,
    namespace: str,
    operator: OperatorThread,
    db: Database,
) -> None:
    refused = {
        "eleven": (
            page([{"channel": "push", "afterSeconds": i} for i in range(11)]),
            "must have at most 10 items",
        ),
        "fax": (page([{"channel": "fax"}]), 'Unsupported value: "fax"'),
        "backwards": (
            page([{"channel": "push", "afterSeconds": 60}, {"channel": "sms", "afterSeconds": 30}]),
            "afterSeconds must not decrease",
        ),
        "no-steps": (page([]), "should have at least 1 items"),
    }
    for name, (spec, message) in refused.items():
        result = control_plane.kubectl(
            "apply", "-f", "-", input=manifest(namespace, name, spec), check=False
        )
        assert result.returncode != 0, name
        assert message in result.stderr, (name, result.stderr)
        assert "spec.escalation.steps" in result.stderr, (name, result.stderr)

    # What a v1alpha1 schema takes no new rule for: the operator rejects it, naming the field.
    await RecipientService(RecipientRepository(db)).put("no-voice", {"pushTokens": ["device-1"]})
    rejected = {
        "with-channels": (page(channels=["push"]), "spec.escalation"),
        "address": (
            {"channel": "sms", "recipient": "+4915112345678", "body": "x"}
            | {"escalation": {"steps": STEPS}},
            "spec.escalation",
        ),
        "no-contact": (
            page([{"channel": "voice"}]) | {"recipientId": "no-voice"},
            "spec.escalation.steps.0.channel",
        ),
    }
    for name, (spec, _) in rejected.items():
        control_plane.kubectl("apply", "-f", "-", input=manifest(namespace, name, spec))
    for name, (_, field) in rejected.items():

        async def is_rejected(name: str = name) -> Any:
            got = await kube.get("Notification", namespace, name)
            return phase(got) == "Rejected" and got

        got = await eventually(is_rejected, timeout=20, what=f"{name} Rejected")
        stalled = condition(got, "Stalled")
        assert stalled is not None and field in stalled["message"], (name, stalled)
