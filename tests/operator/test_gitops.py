"""Health as GitOps tools compute it, from live objects on the real kube-apiserver: the real
kstatus library (sigs.k8s.io/cli-utils, built by scripts/build-kstatus.sh; what Flux's
`wait: true` uses) and the chart's Argo CD health.lua in a real Lua 5.1 (lupa), for a
Notification in every phase and a NotificationPolicy Ready and Stalled; `kubectl wait
--for=condition=Ready` returning once a Notification is sent; a policy whose Secret is missing
holding its notifications (Reconciling, PolicyNotReady) until the Secret appears."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from notify_queue.devcluster import LocalControlPlane
from notify_queue.repositories.db import Database
from notify_queue.services.validation import parse_rfc3339
from tests.operator.conftest import StartOperator
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
from tests.support import eventually, missing_component, notification_service

pytestmark = pytest.mark.kubernetes

ROOT = Path(__file__).resolve().parents[2]
HEALTH_LUA = ROOT / "charts" / "notify-queue" / "argocd" / "health.lua"


@pytest.fixture(scope="session")
def kstatus() -> Path:
    if (
        shutil.which("go") is None
        and subprocess.run(
            [str(ROOT / "scripts" / "build-kstatus.sh"), "--print-path"],
            capture_output=True,
            check=False,
        ).returncode
    ):
        missing_component(
            "go", "no Go toolchain to build the kstatus checker (scripts/build-kstatus.sh)"
        )
    result = subprocess.run(
        [str(ROOT / "scripts" / "build-kstatus.sh")],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    return Path(result.stdout.strip().splitlines()[-1])


def kstatus_of(binary: Path, obj: dict[str, Any]) -> str:
    result = subprocess.run(
        [str(binary)], input=json.dumps(obj), capture_output=True, text=True, check=True
    )
    return str(json.loads(result.stdout)["status"])


def argo_health_of(obj: dict[str, Any]) -> dict[str, str]:
    """Run health.lua as Argo CD does: `obj` a global table, the script's return its verdict."""
    from lupa.lua51 import LuaRuntime  # Argo CD's gopher-lua is Lua 5.1

    lua = LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    verdict = lua.execute(HEALTH_LUA.read_text())
    return {"status": str(verdict["status"]), "message": str(verdict["message"])}


def _secret(namespace: str, name: str, **data: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "stringData": data,
    }


def _true_of(obj: dict[str, Any]) -> list[str]:
    return [
        t
        for t in ("Ready", "Reconciling", "Stalled")
        if (condition(obj, t) or {}).get("status") == "True"
    ]


# phase -> (the one condition True, kstatus, Argo CD health)
EXPECTED = {
    "Pending": ("Reconciling", "InProgress", "Progressing"),
    "Sent": ("Ready", "Current", "Healthy"),
    "Cancelled": ("Ready", "Current", "Healthy"),
    "Failed": ("Stalled", "Failed", "Degraded"),
    "DeadLettered": ("Stalled", "Failed", "Degraded"),
    "Expired": ("Stalled", "Failed", "Degraded"),
    "Rejected": ("Stalled", "Failed", "Degraded"),
}


async def test_every_phase_reads_right_in_kstatus_and_argo_cd(
    kube: Kube,
    namespace: str,
    operator: OperatorThread,
    db: Database,
    database_url: str,
    kstatus: Path,
) -> None:
    soon = (datetime.now(UTC) + timedelta(seconds=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    objects = {
        "Pending": notification(namespace, "pending", delay="1h"),
        "Sent": notification(namespace, "sent"),
        "Cancelled": notification(namespace, "cancelled", delay="1h"),
        "Failed": notification(namespace, "failed", recipient="invalid-1@example.com"),
        "DeadLettered": notification(namespace, "dead", recipient="timeout-1@example.com"),
        # Held from the worker (its policy's Secret does not exist) until it expires.
        "Expired": notification(namespace, "expired", expiresAt=soon, policy="broken"),
        "Rejected": notification(namespace, "rejected", metadata={"blob": "x" * 17_000}),
    }
    await kube.create(
        policy(
            namespace,
            "broken",
            webhook={"url": "http://127.0.0.1:9/hook", "secretRef": {"name": "absent", "key": "k"}},
        )
    )
    for obj in objects.values():
        await kube.create(obj)

    async def pending(name: str) -> object:
        return phase(await kube.get("Notification", namespace, name)) == "Pending"

    await eventually(lambda: pending("cancelled"), timeout=15)
    cancelled = await kube.get("Notification", namespace, "cancelled")
    assert cancelled is not None
    await notification_service(db).cancel(uuid.UUID(cancelled["status"]["notificationId"]))

    # A simulated timeout lasts the provider timeout: short, so six attempts end soon.
    worker = settings_for(database_url, namespace, provider_timeout=0.05)
    async with running_worker(worker, db):
        for expected, obj in objects.items():
            name = obj["metadata"]["name"]

            async def reached(name: str = name, expected: str = expected) -> object:
                live = await kube.get("Notification", namespace, name)
                return phase(live) == expected and live

            live = await eventually(reached, timeout=30, what=f"{name} {expected}")
            one_true, kstatus_result, argo = EXPECTED[expected]
            assert _true_of(live) == [one_true], (expected, live["status"])
            assert kstatus_of(kstatus, live) == kstatus_result, expected
            health = argo_health_of(live)
            assert health["status"] == argo, (expected, health)
            assert expected in health["message"]

    broken = await kube.get("NotificationPolicy", namespace, "broken")
    assert broken is not None and _true_of(broken) == ["Stalled"]
    assert kstatus_of(kstatus, broken) == "Failed"
    assert argo_health_of(broken)["status"] == "Degraded"
    await kube.create(policy(namespace, "fine"))

    async def fine_ready() -> object:
        live = await kube.get("NotificationPolicy", namespace, "fine")
        return _true_of(live or {}) == ["Ready"] and live

    fine = await eventually(fine_ready, timeout=15)
    assert kstatus_of(kstatus, fine) == "Current"
    assert argo_health_of(fine)["status"] == "Healthy"
    # An object the operator has not seen yet, and one of an older generation: both wait.
    assert argo_health_of({"metadata": {"generation": 1}})["status"] == "Progressing"
    stale = {**fine, "metadata": {**fine["metadata"], "generation": 2}}
    assert argo_health_of(stale)["status"] == "Progressing"
    assert kstatus_of(kstatus, stale) == "InProgress"


def test_the_argocd_cm_snippet_carries_the_same_script_for_both_kinds() -> None:
    import yaml

    snippet = yaml.safe_load((HEALTH_LUA.parent / "argocd-cm.yaml").read_text())
    script = HEALTH_LUA.read_text()
    for kind in ("Notification", "NotificationPolicy"):
        assert snippet["data"][f"resource.customizations.health.notifyqueue.io_{kind}"] == script


async def test_kubectl_wait_for_ready_returns_once_the_notification_is_sent(
    kube: Kube,
    namespace: str,
    operator: OperatorThread,
    db: Database,
    database_url: str,
    control_plane: LocalControlPlane,
) -> None:
    await kube.create(notification(namespace, "waited"))
    await eventually(
        lambda: _phase_is(kube, namespace, "waited", "Pending"), timeout=15, what="Pending"
    )
    waiting = asyncio.create_task(
        asyncio.to_thread(
            control_plane.kubectl,
            "wait",
            "--for=condition=Ready",
            "notif/waited",
            "-n",
            namespace,
            "--timeout=60s",
            check=False,
        )
    )
    await asyncio.sleep(0.5)
    assert not waiting.done(), "kubectl wait returned before anything was sent"
    async with running_worker(settings_for(database_url, namespace), db):
        result = await asyncio.wait_for(waiting, timeout=90)
    assert result.returncode == 0, result.stderr
    assert "condition met" in result.stdout
    assert await _phase_is(kube, namespace, "waited", "Sent")


async def _phase_is(kube: Kube, namespace: str, name: str, expected: str) -> bool:
    return phase(await kube.get("Notification", namespace, name)) == expected


async def test_a_policy_without_its_secret_holds_its_notifications_until_the_secret_appears(
    kube: Kube, namespace: str, operator: OperatorThread, db: Database, database_url: str
) -> None:
    await kube.create(
        policy(
            namespace,
            "signed",
            webhook={"url": "http://127.0.0.1:9/hook", "secretRef": {"name": "hooks", "key": "k"}},
        )
    )

    async def stalled() -> object:
        live = await kube.get("NotificationPolicy", namespace, "signed")
        return _true_of(live or {}) == ["Stalled"] and live

    live_policy = await eventually(stalled, timeout=15)
    assert condition(live_policy, "Stalled")["reason"] == "SecretNotFound"  # type: ignore[index]
    await kube.create(notification(namespace, "held", policy="signed"))
    async with running_worker(settings_for(database_url, namespace), db):

        async def held() -> object:
            live = await kube.get("Notification", namespace, "held")
            reconciling = condition(live, "Reconciling") or {}
            return reconciling.get("reason") == "PolicyNotReady" and live

        live = await eventually(held, timeout=20, what="Reconciling/PolicyNotReady")
        assert phase(live) == "Pending" and live["status"]["attempts"] == 0
        assert _true_of(live) == ["Reconciling"]

        # A worker looked at it and held it (its next check is ~30 s away), not sent it.
        async def claimed_and_held() -> object:
            live = await kube.get("Notification", namespace, "held")
            due = (live or {}).get("status", {}).get("nextAttemptAt")
            return due and parse_rfc3339(due) > datetime.now(UTC) + timedelta(seconds=15) and live

        live = await eventually(claimed_and_held, timeout=20, what="held by a claim")
        assert phase(live) == "Pending" and live["status"]["attempts"] == 0

        await kube.create(
            _secret(namespace, "hooks", k="whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY")
        )
        await eventually(
            lambda: _phase_is(kube, namespace, "held", "Sent"), timeout=30, what="Sent"
        )
    sent = await kube.get("Notification", namespace, "held")
    assert _true_of(sent or {}) == ["Ready"]


async def test_transition_times_hold_across_three_retries_on_the_live_object(
    kube: Kube, namespace: str, start_operator: StartOperator, db: Database, database_url: str
) -> None:
    # Every retry written as it happens (retries 300 ms apart would otherwise be coalesced).
    await start_operator(status_coalesce_seconds=0.01)
    await kube.create(
        policy(
            namespace,
            "patient",
            retry={"maxAttempts": 4, "initialBackoff": "300ms", "maxBackoff": "300ms"},
        )
    )
    await eventually(lambda: _policy_ready(kube, namespace, "patient"), timeout=15)
    await kube.create(
        notification(namespace, "flaky", recipient="timeout-2@example.com", policy="patient")
    )
    seen: dict[int, dict[str, str]] = {}  # attempts -> condition type -> lastTransitionTime

    async def dead_lettered() -> bool:
        live = await kube.get("Notification", namespace, "flaky")
        status = (live or {}).get("status") or {}
        if status.get("phase") in ("Pending", "Processing") and status.get("attempts"):
            times = {c["type"]: c["lastTransitionTime"] for c in status["conditions"]}
            seen.setdefault(int(status["attempts"]), times)
        return status.get("phase") == "DeadLettered"

    worker = settings_for(database_url, namespace, provider_timeout=0.05)
    async with running_worker(worker, db):
        await eventually(dead_lettered, timeout=30, interval=0.02, what="DeadLettered")
    assert {1, 2, 3} <= set(seen), seen  # retries 1 to 3 were each seen in progress
    assert len({tuple(sorted(times.items())) for times in seen.values()}) == 1, seen
    final = await kube.get("Notification", namespace, "flaky")
    assert final is not None and _true_of(final) == ["Stalled"]
    first = seen[min(seen)]
    moved = {
        c["type"]
        for c in final["status"]["conditions"]
        if c["lastTransitionTime"] != first[c["type"]]
    }
    # Finishing turned Reconciling off, Stalled on and Delivered to False; Ready stayed False.
    assert moved <= {"Reconciling", "Stalled", "Delivered"}
    assert "Ready" not in moved and "Accepted" not in moved


async def _policy_ready(kube: Kube, namespace: str, name: str) -> bool:
    return _true_of(await kube.get("NotificationPolicy", namespace, name) or {}) == ["Ready"]
