"""The operator of each release this one upgrades from (0.2.0 and 0.1.0, each from its own
virtualenv) against this release's schema and CRDs, as during a roll-out: the pre-upgrade hook has
migrated and `helm upgrade` has replaced the CRDs, and the old operator pod still runs. It must
start, mirror a Notification into the queue and write its status back as this release's worker
delivers it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from notify_queue.devcluster import LocalControlPlane
from tests.operator.support import Kube, condition, notification, phase
from tests.support import eventually
from tests.upgrade.baseline import BASELINES, Baseline, baseline_venv
from tests.upgrade.support import Release, wait_logged

pytestmark = [pytest.mark.kubernetes, pytest.mark.upgrade]


@pytest.mark.parametrize("baseline", BASELINES, ids=lambda b: f"from-{b.release}")
async def test_the_old_operator_mirrors_and_reports_on_the_new_schema_and_crds(
    baseline: Baseline,
    empty_database_url: str,
    control_plane: LocalControlPlane,
    kube: Kube,
    namespace: str,
    tmp_path: Path,
) -> None:
    old = Release(
        baseline.release, baseline_venv(baseline) / "bin" / "python", empty_database_url, tmp_path
    )
    new = Release("new", sys.executable, empty_database_url, tmp_path)
    try:
        # Installed as the old release, then this release's pre-upgrade hook.
        for release in (old, new):
            migrated = release.run("migrate")
            assert migrated.returncode == 0, migrated.stderr
        operator = old.start(
            "operator",
            "--namespace",
            namespace,
            "--status-patches-per-second",
            "500",
            env={"KUBECONFIG": str(control_plane.kubeconfig)},
        )
        await wait_logged(operator, old, "operator started")

        created = await kube.create(notification(namespace, "upgrade", subject="Hi", body="Hello"))

        async def mirrored() -> object:
            obj = await kube.get("Notification", namespace, "upgrade")
            return phase(obj) == "Pending" and obj

        obj = await eventually(mirrored, timeout=60, what="mirrored by the old operator")
        assert condition(obj, "Accepted")["status"] == "True"  # type: ignore[index]
        notification_id = obj["status"]["notificationId"]  # type: ignore[index]
        assert created["metadata"]["uid"]

        worker = new.start("worker", "--poll-interval", "0.2")
        await wait_logged(worker, new, "worker started")

        async def sent() -> object:
            obj = await kube.get("Notification", namespace, "upgrade")
            return phase(obj) == "Sent" and obj

        obj = await eventually(sent, timeout=60, what="Sent, written by the old operator")
        status = obj["status"]  # type: ignore[index]
        assert status["notificationId"] == notification_id and status["attempts"] == 1
        assert condition(obj, "Delivered")["reason"] == "Sent"  # type: ignore[index]
        assert await old.stop(operator) in (0, 143, -15), old.logs()
    finally:
        old.kill_all()
        new.kill_all()
