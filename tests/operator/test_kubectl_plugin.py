"""`kubectl notify` (the `kubectl-notify` executable) against the test control plane.

Each test sets up what the chart would install, as far as the control plane can hold it: the API
Service (with the chart's labels), the API Deployment naming the token Secret in its environment,
that Secret, and, since no kubelet runs, a Pod object and an Endpoints object that point the
Service at a real `notify-queue api` process listening on this machine's non-loopback address
(the API server refuses loopback endpoints and proxies only to addresses that are a Pod's). So
every request the plugin sends to the API goes through the API server's real service proxy.
The operator and a worker are the real ones, as in the other operator tests.

The first test runs the plugin through the real kubectl (found on PATH as a plugin); the others
run the executable directly.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
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
from tests.support import eventually, running_api

pytestmark = pytest.mark.kubernetes

API_TOKEN, ADMIN_TOKEN = "plugin-client-token", "plugin-admin-token"
PLUGIN = Path(sys.executable).parent / "kubectl-notify"
LABELS = {
    "app.kubernetes.io/name": "notify-queue",
    "app.kubernetes.io/instance": "nq",
    "app.kubernetes.io/component": "api",
}


def local_address() -> str | None:
    """This machine's address on its default route: an endpoint the API server accepts."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("198.51.100.1", 9))  # TEST-NET-2: only picks a route, sends nothing
        except OSError:
            return None
        address = str(s.getsockname()[0])
    return None if address.startswith("127.") else address


@dataclass
class Plugin:
    """Runs `kubectl-notify` (or `kubectl notify`) with a kubeconfig, off the test's loop."""

    cluster: LocalControlPlane
    namespace: str

    env: dict[str, str] = field(default_factory=dict)

    async def run(
        self, *args: str, user: str = "admin", via_kubectl: bool = False
    ) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFY_QUEUE_")}
        env |= self.env
        env["KUBECONFIG"] = str(self.cluster.kubeconfig_for(user))
        env["PATH"] = f"{PLUGIN.parent}{os.pathsep}{env.get('PATH', '')}"
        command = (
            [str(self.cluster.bin_dir / "kubectl"), "notify", *args]
            if via_kubectl
            else [str(PLUGIN), *args]
        )
        return await asyncio.to_thread(
            subprocess.run, command, env=env, capture_output=True, text=True, timeout=120
        )

    async def ok(self, *args: str, **kwargs: Any) -> str:
        result = await self.run(*args, **kwargs)
        assert result.returncode == 0, result.stderr
        return result.stdout

    async def json(self, *args: str) -> Any:
        return json.loads(await self.ok(*args, "-o", "json"))


def _manifests(namespace: str, address: str, port: int) -> str:
    """The chart's API objects, and the Pod and Endpoints a kubelet and controllers would make."""
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "nq-notify-queue-secrets", "namespace": namespace},
            "stringData": {"api-token": API_TOKEN, "admin-token": ADMIN_TOKEN},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "nq-notify-queue-api",
                "namespace": namespace,
                "labels": {**LABELS, "app.kubernetes.io/part-of": "notify-queue"},
            },
            "spec": {
                "selector": {"matchLabels": LABELS},
                "template": {
                    "metadata": {"labels": LABELS},
                    "spec": {
                        "containers": [
                            {
                                "name": "api",
                                "image": "notify-queue:test",
                                "env": [
                                    {
                                        "name": f"NOTIFY_QUEUE_{key.upper().replace('-', '_')}",
                                        "valueFrom": {
                                            "secretKeyRef": {
                                                "name": "nq-notify-queue-secrets",
                                                "key": key,
                                            }
                                        },
                                    }
                                    for key in ("api-token", "admin-token")
                                ],
                            }
                        ]
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": "nq-notify-queue-api",
                "namespace": namespace,
                "labels": {**LABELS, "app.kubernetes.io/part-of": "notify-queue"},
            },
            "spec": {
                "selector": LABELS,
                "ports": [{"name": "http", "port": 8080, "targetPort": "http"}],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "nq-notify-queue-api-0", "namespace": namespace, "labels": LABELS},
            "spec": {
                "nodeName": "test-node",
                "containers": [{"name": "api", "image": "notify-queue:test"}],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Endpoints",
            "metadata": {"name": "nq-notify-queue-api", "namespace": namespace},
            "subsets": [
                {
                    "addresses": [
                        {
                            "ip": address,
                            "targetRef": {
                                "kind": "Pod",
                                "namespace": namespace,
                                "name": "nq-notify-queue-api-0",
                            },
                        }
                    ],
                    "ports": [{"name": "http", "port": port}],
                }
            ],
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "nq-notify-queue-worker-urgent",
                "namespace": namespace,
                "labels": {"notifyqueue.io/worker-pool": "urgent"},
                "annotations": {
                    "notifyqueue.io/priorities": "HIGH",
                    "notifyqueue.io/max-replicas": "4",
                },
            },
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"pool": "urgent"}},
                "template": {
                    "metadata": {"labels": {"pool": "urgent"}},
                    "spec": {"containers": [{"name": "worker", "image": "notify-queue:test"}]},
                },
            },
        },
    ]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})


@pytest.fixture
async def plugin(
    control_plane: LocalControlPlane, namespace: str, database_url: str, tmp_path: Path
) -> AsyncIterator[Plugin]:
    """The plugin, with a real API behind the namespace's API Service."""
    address = local_address()
    if address is None:
        pytest.skip("no non-loopback IPv4 address: the API server proxies to none other")
    assert PLUGIN.exists(), f"{PLUGIN} missing: pip install -e . installs the entry point"
    args = ("--api-token", API_TOKEN, "--admin-token", ADMIN_TOKEN)
    async with running_api(database_url, tmp_path / "api.log", *args, host=address) as url:
        port = int(url.rsplit(":", 1)[1])
        kubectl = control_plane.kubectl
        await asyncio.to_thread(
            kubectl, "apply", "-f", "-", input=_manifests(namespace, address, port)
        )
        status = {"status": {"phase": "Running", "podIP": address, "podIPs": [{"ip": address}]}}
        await asyncio.to_thread(
            kubectl, "patch", "pod", "nq-notify-queue-api-0", "-n", namespace,
            "--subresource=status", "--type=merge", "-p", json.dumps(status),
        )  # fmt: skip
        yield Plugin(control_plane, namespace)


async def _dead_lettered(
    kube: Kube, plugin: Plugin, database_url: str, db: Database, name: str
) -> dict[str, Any]:
    """A Notification that two failed attempts dead-lettered (its policy allows two)."""
    ns = plugin.namespace
    retry = {"maxAttempts": 2, "initialBackoff": "50ms", "maxBackoff": "100ms"}
    await kube.create(policy(ns, "default", retry=retry))

    async def policy_ready() -> bool:
        # The attempt budget is fixed when the row is made: the policy must be mirrored first.
        ready = condition(await kube.get("NotificationPolicy", ns, "default"), "Ready")
        return bool(ready and ready["status"] == "True")

    await eventually(policy_ready, timeout=30)
    await kube.create(notification(ns, name))
    flaky = settings_for(database_url, ns, sim_failure_rate=1.0)
    async with running_worker(flaky, db):

        async def dead() -> dict[str, Any] | None:
            obj = await kube.get("Notification", ns, name)
            return obj if phase(obj) == "DeadLettered" else None

        return dict(await eventually(dead, timeout=30))


async def test_why_through_kubectl_shows_the_attempts_the_policy_and_the_outcome(
    kube: Kube, plugin: Plugin, operator: OperatorThread, database_url: str, db: Database
) -> None:
    await _dead_lettered(kube, plugin, database_url, db, "doomed")
    text = await plugin.ok("why", "doomed", "-n", plugin.namespace, via_kubectl=True)
    lines = text.splitlines()
    assert "Phase:" in text and "DeadLettered" in text
    assert ["Attempts:", "2", "of", "2"] in [line.split() for line in lines], text
    assert ["Delivery", "attempts:", "2"] in [line.split() for line in lines], text
    assert "simulated temporary failure" in text
    assert "default: Ready=True; retry 2 attempts, backoff 50ms..100ms" in text
    # The delivery attempts come from the API, through the service proxy, with the token.
    header = next(i for i, line in enumerate(lines) if line.strip().startswith("AT "))
    assert lines[header].split() == ["AT", "PROVIDER", "OUTCOME", "DURATION", "ERROR"]
    attempts = lines[header + 1 : header + 3]
    assert all("temporary_failure" in row for row in attempts), text

    report = await plugin.json("why", "doomed", "-n", plugin.namespace)
    assert report["api"] == "ok" and report["phase"] == "DeadLettered"
    assert [a["outcome"] for a in report["deliveryAttempts"]] == ["temporary_failure"] * 2
    assert report["maxAttempts"] == 2 and report["waiting"] is None


async def test_a_scheduled_notification_says_what_it_waits_for_and_that_no_policy_applies(
    kube: Kube, plugin: Plugin, operator: OperatorThread
) -> None:
    await kube.create(notification(plugin.namespace, "later", delay="1h"))

    async def pending() -> Any:
        report = await plugin.json("why", "later", "-n", plugin.namespace)
        return report if report["phase"] == "Pending" and report["waiting"] else None

    report = await eventually(pending, timeout=30)
    # The operator's Reconciling condition today (Waiting), status.waiting once it is written.
    assert report["waiting"]["reason"] in ("Waiting", "Scheduled")
    assert report["waiting"]["until"]
    assert report["policy"] == {
        "name": "default",
        "found": False,
        "note": "does not exist: the workers' defaults apply",
    }
    text = await plugin.ok("why", "later", "-n", plugin.namespace)
    waiting = next(line for line in text.splitlines() if line.startswith("Waiting:"))
    assert re.search(r" until \S+Z \(in (59|60)m\)", waiting), waiting
    assert re.search(r"^Delivery attempts: +<none>$", text, re.MULTILINE), text


async def test_retry_and_dead_letters_send_dead_lettered_notifications_back_to_pending(
    kube: Kube, plugin: Plugin, operator: OperatorThread, database_url: str, db: Database
) -> None:
    ns = plugin.namespace
    await _dead_lettered(kube, plugin, database_url, db, "first")
    await kube.create(notification(ns, "second"))
    flaky = settings_for(database_url, ns, sim_failure_rate=1.0)
    async with running_worker(flaky, db):

        async def both_dead() -> bool:
            objs = [await kube.get("Notification", ns, n) for n in ("first", "second")]
            return all(phase(o) == "DeadLettered" for o in objs)

        await eventually(both_dead, timeout=30)

    listed = (await plugin.ok("dead-letters", "-n", ns)).splitlines()
    assert listed[0].split()[:3] == ["NAME", "CHANNEL", "RECIPIENT"]
    assert [line.split()[0] for line in listed[1:]] == ["first", "second"]
    assert [d["name"] for d in await plugin.json("dead-letters", "-n", ns)] == ["first", "second"]

    retried = await plugin.ok("retry", "first", "-n", ns)
    first_id = (await kube.get("Notification", ns, "first") or {})["status"]["notificationId"]
    assert retried.strip() == (
        f"notification.notifyqueue.io/first retried ({first_id} PENDING again)"
    )

    async def pending(name: str) -> bool:
        return phase(await kube.get("Notification", ns, name)) == "Pending"

    await eventually(lambda: pending("first"), timeout=30)
    again = await plugin.run("retry", "first", "-n", ns)
    assert again.returncode == 1 and again.stdout == ""
    assert again.stderr == (
        f"error: notification {ns}/first is Pending; only Failed or DeadLettered notifications "
        "can be retried\n"
    )

    everything = (await plugin.ok("dead-letters", "-n", ns, "--retry")).splitlines()
    assert everything[0].startswith("notification.notifyqueue.io/second retried (")
    assert everything[-1] == "1 retried"
    await eventually(lambda: pending("second"), timeout=30)
    assert (await plugin.ok("dead-letters", "-n", ns)).strip() == (
        f"No dead-lettered notifications in namespace {ns}."
    )
    report = await plugin.json("why", "second", "-n", ns)
    assert [r["fromStatus"] for r in report["retries"]] == ["DEAD_LETTERED"]


async def test_top_shows_depth_per_lane_statuses_and_worker_pools(
    kube: Kube, plugin: Plugin, operator: OperatorThread
) -> None:
    await kube.create(notification(plugin.namespace, "urgent", priority="HIGH"))

    async def due() -> Any:
        report = await plugin.json("top", "-n", plugin.namespace)
        return report if report["status"] and report["status"]["due"]["HIGH"] == 1 else None

    report = await eventually(due, timeout=30)
    assert report["api"] == "ok"
    assert report["apiService"] == f"{plugin.namespace}/nq-notify-queue-api"
    assert report["pools"] == [
        {
            "pool": "urgent",
            "deployment": "nq-notify-queue-worker-urgent",
            "namespace": plugin.namespace,
            "replicas": 2,
            "readyReplicas": 0,
            "priorities": "HIGH",
            "channels": None,
            "minReplicas": None,
            "maxReplicas": "4",
            "targetDepthPerReplica": None,
        }
    ]
    assert set(report["oldestDue"]) == {"HIGH", "NORMAL", "LOW"}
    text = await plugin.ok("top", "-n", plugin.namespace)
    lines = [line.split() for line in text.splitlines()]
    assert ["LANE", "DUE", "NOW", "OLDEST", "DUE"] in lines
    assert [line[:2] for line in lines if line[:1] == ["HIGH"]] == [["HIGH", "1"]]
    assert ["PENDING", "1"] in lines
    assert ["urgent", "nq-notify-queue-worker-urgent", "HIGH", "all", "0/2", "1", "4"] in lines


async def test_with_an_api_url_why_top_and_retry_reach_an_api_no_service_fronts(
    kube: Kube,
    control_plane: LocalControlPlane,
    namespace: str,
    operator: OperatorThread,
    database_url: str,
    db: Database,
    tmp_path: Path,
) -> None:
    """`notify-queue up --kubernetes`: the API on loopback, no Service, so the plugin is given
    the API's address ($NOTIFY_QUEUE_API_URL or --api-url) and its tokens in the variables the
    API reads; a wrong token is refused in one line."""
    await _dead_lettered(kube, Plugin(control_plane, namespace), database_url, db, "lost")

    args = ("--api-token", API_TOKEN, "--admin-token", ADMIN_TOKEN)
    async with running_api(database_url, tmp_path / "api.log", *args) as url:
        tokens = {"NOTIFY_QUEUE_API_TOKEN": API_TOKEN, "NOTIFY_QUEUE_ADMIN_TOKEN": ADMIN_TOKEN}
        plugin = Plugin(control_plane, namespace, env={"NOTIFY_QUEUE_API_URL": url} | tokens)
        report = await plugin.json("why", "lost", "-n", namespace)
        assert report["api"] == "ok"
        assert [a["outcome"] for a in report["deliveryAttempts"]] == ["temporary_failure"] * 2
        flagged = Plugin(control_plane, namespace, env=tokens)
        top = await flagged.json("top", "-n", namespace, "--api-url", url)
        assert (top["api"], top["apiUrl"]) == ("ok", url)
        assert top["status"]["counts"]["DEAD_LETTERED"] == 1
        retried = await plugin.ok("retry", "lost", "-n", namespace, via_kubectl=True)
        assert retried.startswith("notification.notifyqueue.io/lost retried (")
        unauthorised = Plugin(control_plane, namespace, env={"NOTIFY_QUEUE_API_URL": url})
        refused = await unauthorised.json("why", "lost", "-n", namespace)
        assert refused["api"].startswith(
            "the API refused the token from $NOTIFY_QUEUE_API_TOKEN / $NOTIFY_QUEUE_ADMIN_TOKEN"
        )


async def test_ack_annotates_the_notification_once(
    kube: Kube, plugin: Plugin, control_plane: LocalControlPlane
) -> None:
    await kube.create(notification(plugin.namespace, "page", delay="1h"))
    first = await plugin.run("ack", "page", "-n", plugin.namespace)
    assert first.returncode == 0
    assert first.stdout == "notification.notifyqueue.io/page acknowledged\n"
    # This object has no escalation (and the CRD may not know spec.escalation yet): said so.
    assert "shows no escalation" in first.stderr
    obj = await kube.get("Notification", plugin.namespace, "page")
    assert obj is not None
    assert obj["metadata"]["annotations"]["notifyqueue.io/acknowledged"] == "true"
    second = await plugin.ok("ack", "page", "-n", plugin.namespace)
    assert second == "notification.notifyqueue.io/page already acknowledged\n"


async def test_without_rights_to_the_api_why_degrades_and_retry_fails_in_one_line(
    kube: Kube, plugin: Plugin, control_plane: LocalControlPlane, operator: OperatorThread
) -> None:
    """The viewer may read Notifications and policies, nothing else: what is on the resource
    is shown, and the line about delivery attempts says why they are missing."""
    ns = plugin.namespace
    rbac = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "notification-reader", "namespace": ns},
                "rules": [
                    {
                        "apiGroups": ["notifyqueue.io"],
                        "resources": ["notifications", "notificationpolicies"],
                        "verbs": ["get", "list"],
                    }
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "notification-reader", "namespace": ns},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "notification-reader",
                },
                "subjects": [
                    {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "Group",
                        "name": "notify-queue-viewers",
                    }
                ],
            },
        ],
    }
    await asyncio.to_thread(control_plane.kubectl, "apply", "-f", "-", input=json.dumps(rbac))
    await kube.create(notification(ns, "watched", delay="1h"))

    async def handled() -> bool:
        return phase(await kube.get("Notification", ns, "watched")) == "Pending"

    await eventually(handled, timeout=30)
    text = await plugin.ok("why", "watched", "-n", ns, user="viewer")
    line = next(x for x in text.splitlines() if x.startswith("Delivery attempts:"))
    assert "unavailable:" in line and "forbidden" in line, line
    assert "Phase:" in text and "Pending" in text

    refused = await plugin.run("retry", "watched", "-n", ns, user="viewer")
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    missing = await plugin.run("why", "nothing-here", "-n", ns)
    assert missing.returncode == 1
    assert missing.stderr == f"error: notification {ns}/nothing-here not found\n"
    bad = await plugin.run("top", "-n", ns, "--api-service", f"{ns}/no-such-service")
    assert bad.returncode == 0 and f"service {ns}/no-such-service not found" in bad.stdout
