"""The local control plane (`notify_queue.devcluster`) itself: extra token users for RBAC tests are
authenticated but authorised for nothing until a Role says so, and stopping it leaves no process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from notify_queue.devcluster import LocalControlPlane

pytestmark = pytest.mark.kubernetes


def test_an_extra_user_is_authenticated_with_its_groups_but_not_authorised(
    control_plane: LocalControlPlane,
) -> None:
    whoami = json.loads(control_plane.kubectl("auth", "whoami", "-o", "json", user="viewer").stdout)
    assert whoami["status"]["userInfo"]["username"] == "viewer"
    assert "notify-queue-viewers" in whoami["status"]["userInfo"]["groups"]
    assert (
        control_plane.kubectl(
            "auth", "can-i", "list", "notifications", "-A", user="viewer", check=False
        ).stdout.strip()
        == "no"
    )
    assert (
        control_plane.kubectl("auth", "can-i", "list", "notifications", "-A").stdout.strip()
        == "yes"
    )

    control_plane.kubectl(
        "create",
        "clusterrole",
        "notif-reader",
        "--verb=get,list",
        "--resource=notifications.notifyqueue.io",
    )
    control_plane.kubectl(
        "create",
        "clusterrolebinding",
        "notif-reader",
        "--clusterrole=notif-reader",
        "--group=notify-queue-viewers",
    )
    assert (
        control_plane.kubectl(
            "auth", "can-i", "list", "notifications", "-A", user="viewer"
        ).stdout.strip()
        == "yes"
    )
    assert (
        control_plane.kubectl(
            "auth", "can-i", "delete", "notifications", "-A", user="viewer", check=False
        ).stdout.strip()
        == "no"
    )


def test_a_service_account_token_authenticates_as_the_service_account(
    control_plane: LocalControlPlane,
) -> None:
    control_plane.kubectl("create", "namespace", "sa-test")
    kubeconfig = control_plane.kubeconfig_for_service_account("sa-test", "robot")
    user = "system:serviceaccount:sa-test:robot"
    assert kubeconfig == control_plane.kubeconfig_for(user)
    whoami = json.loads(control_plane.kubectl("auth", "whoami", "-o", "json", user=user).stdout)
    assert whoami["status"]["userInfo"]["username"] == user


def test_stopping_a_control_plane_ends_every_process_it_started(
    control_plane: LocalControlPlane, tmp_path: Path
) -> None:
    with LocalControlPlane(tmp_path / "second", bin_dir=control_plane.bin_dir) as second:
        processes = list(second.processes())
        assert len(processes) == 2 and all(p.poll() is None for p in processes)
        assert second.server != control_plane.server
        assert second.kubectl("get", "namespaces").returncode == 0
    assert all(p.poll() is not None for p in processes)
    assert list(second.processes()) == []
