"""`helm install` of the chart into the test cluster, and the operator's RBAC shown to be enough
and no more.

The test cluster has no kubelet and no Job controller, so the migration hook is played here the
way those would run it: the Job's container arguments and environment (its Secret references
resolved) are run with this checkout's `notify-queue` against a real PostgreSQL, then the Job's
status is set to Complete, which is what Helm waits for. Then the operator runs with a token of
the chart's ServiceAccount (`kubectl create token`), workers run from the chart's pool
arguments, and every part of the operator's job is exercised: mirroring, status write-back,
policies with a Secret, cancel on delete, TTL deletion, scaling, Events. `kubectl auth can-i`
then shows what the ServiceAccount must not be able to do stays forbidden.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest
import yaml

from notify_queue.cli import build_parser
from notify_queue.devcluster import LocalControlPlane
from notify_queue.embedded import EmbeddedPostgres
from notify_queue.repositories.db import Database
from notify_queue.settings import ROLE_SETTINGS, DatabaseOptions, load_settings
from tests.operator.support import OperatorThread, running_worker, settings_for
from tests.shipping.support import CHART, Tools
from tests.support import eventually, missing_component

pytestmark = pytest.mark.kubernetes

RELEASE = "nq"
OPERATOR_SA = f"{RELEASE}-notify-queue-operator"


@dataclass
class Release:
    namespace: str
    database_url: str
    values_file: Path
    install_output: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _secret_value(
    tools: Tools, kubeconfig: Path, namespace: str, name: str, key: str
) -> str | None:
    result = tools.kubectl(
        "get", "secret", name, "-n", namespace, "-o", "json", kubeconfig=kubeconfig, check=False
    )
    if result.returncode != 0:
        return None
    data = json.loads(result.stdout).get("data") or {}
    return base64.b64decode(data[key]).decode() if key in data else None


def _container_environment(
    tools: Tools, kubeconfig: Path, namespace: str, container: dict[str, Any]
) -> dict[str, str]:
    """The container's environment as the kubelet would build it (Secret references resolved)."""
    env: dict[str, str] = {}
    for variable in container.get("env", []):
        if "value" in variable:
            env[variable["name"]] = variable["value"]
            continue
        ref = variable["valueFrom"]["secretKeyRef"]
        value = _secret_value(tools, kubeconfig, namespace, ref["name"], ref["key"])
        if value is None:
            assert ref.get("optional"), (
                f"{variable['name']}: Secret {ref['name']}/{ref['key']} missing"
            )
            continue
        env[variable["name"]] = value
    return env


def _settings_of(env: dict[str, str], args: list[str], **overrides: Any) -> Any:
    """The settings the program builds from this environment and these arguments: its role's,
    from the variables of that role's options (the program ignores the others)."""
    parsed = vars(build_parser().parse_args(args))
    model: type[DatabaseOptions] = ROLE_SETTINGS[parsed.pop("role")]
    values = {
        k.removeprefix("NOTIFY_QUEUE_").lower(): v
        for k, v in env.items()
        if k.startswith("NOTIFY_QUEUE_")
        and k.removeprefix("NOTIFY_QUEUE_").lower() in model.model_fields
    }
    flags = {k: v for k, v in parsed.items() if v is not None}
    return load_settings(model, **{**values, **flags, **overrides})


def _run_hook_jobs(
    tools: Tools, kubeconfig: Path, namespace: str, helm: subprocess.Popen[str]
) -> list[str]:
    """Play the Job controller for the release's hook Jobs until helm exits; return their logs.

    The migration Job runs `notify-queue <args>`; the API-token Job (pre-install, pre-upgrade)
    runs `python -m notify_queue.operator.api_token <args>` and the uninstall Job (pre-delete)
    `python -m notify_queue.operator.release <args>`, each with a token of the Job's own
    ServiceAccount, as its pod would (the ServiceAccount exists while the hooks run).
    """
    job_names = [f"{RELEASE}-notify-queue-{c}" for c in ("api-token", "migrate", "release")]
    logs = []
    done_uids: set[str] = set()
    deadline = time.monotonic() + 180
    while helm.poll() is None:
        assert time.monotonic() < deadline, "helm did not finish"
        jobs = []
        for job_name in job_names:
            result = tools.kubectl(
                "get",
                "job",
                job_name,
                "-n",
                namespace,
                "-o",
                "json",
                kubeconfig=kubeconfig,
                check=False,
            )
            if result.returncode == 0:
                jobs.append(json.loads(result.stdout))
        pending = [
            job
            for job in jobs
            if job["metadata"]["uid"] not in done_uids  # not an earlier release's Job
            and not any(
                c["type"] in ("Complete", "Failed")
                for c in job.get("status", {}).get("conditions", [])
            )
        ]
        if not pending:
            time.sleep(0.2)
            continue
        job = pending[0]
        (container,) = job["spec"]["template"]["spec"]["containers"]
        env = _container_environment(tools, kubeconfig, namespace, container)
        if container.get("command", [None])[0] == "python":
            token_config = _service_account_kubeconfig_at(
                tools,
                kubeconfig,
                namespace,
                Path(tempfile.mkdtemp()) / "kubeconfig",
                account=job["spec"]["template"]["spec"]["serviceAccountName"],
            )
            command = [
                sys.executable,
                *container["command"][1:],
                *container["args"],
                "--kubeconfig",
                str(token_config),
            ]
        else:
            command = [str(Path(sys.executable).parent / "notify-queue"), *container["args"]]
        run = subprocess.run(
            command,
            env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), **env},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert run.returncode == 0, f"the Job {job['metadata']['name']} failed: {run.stderr}"
        logs.append(run.stdout + run.stderr)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        conditions = [
            {"type": t, "status": "True", "lastProbeTime": now, "lastTransitionTime": now}
            for t in ("SuccessCriteriaMet", "Complete")
        ]
        status = {"startTime": now, "completionTime": now, "succeeded": 1, "conditions": conditions}
        tools.kubectl(
            "patch",
            "job",
            job["metadata"]["name"],
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": status}),
            kubeconfig=kubeconfig,
        )
        done_uids.add(job["metadata"]["uid"])
    return logs


def _helm_with_hooks(
    tools: Tools, kubeconfig: Path, namespace: str, *args: str
) -> tuple[str, list[str]]:
    helm = subprocess.Popen(
        [
            str(tools.bin_dir / "helm"),
            *args,
            "--namespace",
            namespace,
            "--kubeconfig",
            str(kubeconfig),
            "--timeout",
            "3m",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        logs = _run_hook_jobs(tools, kubeconfig, namespace, helm)
        out, err = helm.communicate(timeout=60)
    finally:
        if helm.poll() is None:
            helm.send_signal(signal.SIGTERM)
            helm.wait(timeout=30)
    assert helm.returncode == 0, err
    return out, logs


@pytest.fixture(scope="module")
def release(
    tools: Tools,
    cluster: LocalControlPlane,
    pg_server: EmbeddedPostgres,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Release]:
    """The chart installed with its defaults, but the database URL, into a restricted namespace."""
    database = f"helm_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}")  # empty: the hook must create the schema
    url = pg_server.url(database)
    namespace = tools.namespace(cluster.kubeconfig, prefix="helm")
    values = tmp_path_factory.mktemp("helm") / "values.yaml"
    values.write_text(yaml.safe_dump({"database": {"url": url}}))
    out, logs = _helm_with_hooks(
        tools,
        cluster.kubeconfig,
        namespace,
        "install",
        RELEASE,
        str(CHART),
        "--values",
        str(values),
    )
    # The API token's Secret first, then the migration (the hooks' weights).
    assert len(logs) == 2 and "created with a new token" in logs[0], logs
    assert "schema up to date" in logs[1]
    yield Release(namespace, url, values, out)
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


def test_helm_install_migrates_the_database_in_a_hook_before_the_release(
    release: Release, tools: Tools, kubeconfig: Path
) -> None:
    from notify_queue.repositories.db import Database
    from notify_queue.repositories.schema import missing_steps

    async def missing() -> list[str]:
        async with Database(release.database_url, pool_size=1) as db:
            return await missing_steps(db)

    assert asyncio.run(missing()) == []  # every step this release needs (docs/upgrading.md)
    assert "STATUS: deployed" in release.install_output
    assert "kubectl get notif" in release.install_output  # the NOTES
    # The hook's copy of the database URL is gone; the Job stays for its logs.
    assert (
        _secret_value(
            tools, kubeconfig, release.namespace, f"{RELEASE}-notify-queue-migrate", "database-url"
        )
        is None
    )
    tools.kubectl(
        "get",
        "job",
        f"{RELEASE}-notify-queue-migrate",
        "-n",
        release.namespace,
        kubeconfig=kubeconfig,
    )
    deployments = tools.json("get", "deployments", "-n", release.namespace, kubeconfig=kubeconfig)[
        "items"
    ]
    assert {d["metadata"]["name"] for d in deployments} == {
        f"{RELEASE}-notify-queue-{c}" for c in ("api", "operator", "worker-urgent", "worker-bulk")
    }


def _service_account_kubeconfig(
    tools: Tools, cluster: LocalControlPlane, namespace: str, path: Path
) -> Path:
    return _service_account_kubeconfig_at(tools, cluster.kubeconfig, namespace, path)


def _service_account_kubeconfig_at(
    tools: Tools, admin: Path, namespace: str, path: Path, *, account: str = OPERATOR_SA
) -> Path:
    token = tools.kubectl(
        "create",
        "token",
        account,
        "-n",
        namespace,
        "--duration=1h",
        kubeconfig=admin,
    ).stdout.strip()
    config = json.loads(admin.read_text())
    config["users"] = [{"name": account, "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = account
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


def _deployment(tools: Tools, kubeconfig: Path, namespace: str, component: str) -> dict[str, Any]:
    return dict(
        tools.json(
            "get",
            "deployment",
            f"{RELEASE}-notify-queue-{component}",
            "-n",
            namespace,
            kubeconfig=kubeconfig,
        )
    )


async def test_the_operator_does_its_whole_job_with_only_the_charts_service_account(
    release: Release,
    tools: Tools,
    cluster: LocalControlPlane,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    kubeconfig, ns = cluster.kubeconfig, release.namespace
    sa_kubeconfig = _service_account_kubeconfig(
        tools, cluster, ns, tmp_path / "kubeconfig-operator"
    )
    who = tools.kubectl(
        "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}", kubeconfig=sa_kubeconfig
    )
    assert who.stdout == f"system:serviceaccount:{ns}:{OPERATOR_SA}"

    operator_pod = _deployment(tools, kubeconfig, ns, "operator")["spec"]["template"]["spec"]
    (container,) = operator_pod["containers"]
    health_port = _free_port()
    settings = _settings_of(
        _container_environment(tools, kubeconfig, ns, container),
        container["args"],
        host="127.0.0.1",
        metrics_port=health_port,
        scale_interval=0.3,
        status_patches_per_second=500.0,
    )
    tools.kubectl(
        "create",
        "secret",
        "generic",
        "webhook-key",
        "-n",
        ns,
        "--from-literal=key=whsec_"
        + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode(),
        kubeconfig=kubeconfig,
    )
    manifests = f"""
apiVersion: notifyqueue.io/v1alpha1
kind: NotificationPolicy
metadata: {{name: default, namespace: {ns}}}
spec:
  rateLimit: {{maxPerWindow: 100, window: 1h}}
  webhook: {{url: "http://127.0.0.1:9/events", secretRef: {{name: webhook-key, key: key}}}}
  ttlSecondsAfterFinished: 2
---
apiVersion: notifyqueue.io/v1alpha1
kind: Notification
metadata: {{name: code, namespace: {ns}}}
spec: {{channel: sms, recipient: "+4915112345678", body: "Your code is 123456", priority: HIGH}}
---
apiVersion: notifyqueue.io/v1alpha1
kind: Notification
metadata: {{name: later, namespace: {ns}}}
spec:
  channel: email
  recipient: later@example.com
  body: tomorrow
  sendAt: "{(datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")}"
"""
    workers = []
    for pool in ("urgent", "bulk"):
        (worker,) = _deployment(tools, kubeconfig, ns, f"worker-{pool}")["spec"]["template"][
            "spec"
        ]["containers"]
        workers.append(
            _settings_of(
                _container_environment(tools, kubeconfig, ns, worker),
                worker["args"],
                host="127.0.0.1",
                metrics_port=None,
                poll_interval=0.2,
                shutdown_grace_seconds=1.0,
            )
        )
    assert [w.priorities for w in workers] == [["HIGH"], ["NORMAL", "LOW"]]

    caplog.set_level(logging.INFO)
    # Every Kubernetes call of the operator, kopf's included, goes out with this token only.
    operator = await OperatorThread(settings, sa_kubeconfig).start()
    try:
        async with (
            Database(release.database_url, pool_size=4) as db_urgent,
            Database(release.database_url, pool_size=4) as db_bulk,
            running_worker(workers[0], db_urgent),
            running_worker(workers[1], db_bulk),
        ):
            tools.kubectl("apply", "-f", "-", input=manifests, kubeconfig=kubeconfig)

            def get(kind: str, name: str) -> dict[str, Any] | None:
                r = tools.kubectl(
                    "get", kind, name, "-n", ns, "-o", "json", kubeconfig=kubeconfig, check=False
                )
                return json.loads(r.stdout) if r.returncode == 0 else None

            async def policy_ready() -> bool:
                conditions = ((get("npol", "default") or {}).get("status") or {}).get(
                    "conditions"
                ) or []
                return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

            await eventually(policy_ready, timeout=30)

            seen_sent: list[bool] = []

            async def code_sent_then_deleted() -> bool:
                obj = get("notif", "code")
                if obj is not None and (obj.get("status") or {}).get("phase") == "Sent":
                    seen_sent.append(True)
                return obj is None and bool(seen_sent)

            # Mirrored, delivered by the urgent pool, status written back, deleted by the TTL.
            await eventually(code_sent_then_deleted, timeout=45, interval=0.1)

            async def later_pending() -> bool:
                return ((get("notif", "later") or {}).get("status") or {}).get("phase") == "Pending"

            await eventually(later_pending, timeout=30)
            tools.kubectl(
                "delete", "notif", "later", "-n", ns, "--wait=false", kubeconfig=kubeconfig
            )

            async def later_gone() -> bool:
                return get("notif", "later") is None

            # Deleted at once (no finalizer), then cancelled in the queue on its DELETED event.
            await eventually(later_gone, timeout=30)

            async def statuses() -> dict[str, str]:
                with psycopg.connect(release.database_url) as conn:
                    return dict(
                        conn.execute(
                            "SELECT recipient, status FROM nq_all_notifications"
                            " WHERE recipient IN (%s, %s)",
                            ("+4915112345678", "later@example.com"),
                        ).fetchall()
                    )

            async def later_cancelled() -> bool:
                return await statuses() == {
                    "+4915112345678": "SENT",
                    "later@example.com": "CANCELLED",
                }

            await eventually(
                later_cancelled, timeout=30, what="SENT, and the deleted one CANCELLED"
            )

            async def urgent_scaled_to_its_minimum() -> bool:
                return (
                    _deployment(tools, kubeconfig, ns, "worker-urgent")["spec"].get("replicas") == 2
                )

            # The chart sets no replicas (1 by default); the operator brings the pool to min 2.
            await eventually(urgent_scaled_to_its_minimum, timeout=30)

            async def events_posted() -> set[str]:
                items = tools.json("get", "events", "-n", ns, kubeconfig=kubeconfig)["items"]
                reasons = {e["reason"] for e in items}
                return reasons if {"Accepted", "Scaled"} <= reasons else set()

            await eventually(events_posted, timeout=30)

            async with (
                aiohttp.ClientSession() as http,
                http.get(f"http://127.0.0.1:{health_port}/healthz") as response,
            ):
                assert response.status == 200  # what the chart's liveness probe asks
    finally:
        await operator.stop()
    refused = [
        r.getMessage()
        for r in caplog.records
        # Whole words: a notification's uuid may hold "403" (a run failed on 79403e4b).
        if re.search(r"\b(forbidden|403|permission)\b", r.getMessage().lower())
    ]
    assert not refused, "the operator was refused:\n" + "\n".join(refused[:10])


@pytest.mark.parametrize(
    ("verb", "resource", "allowed"),
    [
        # What the operator does (see the chart's rbac.yaml for why).
        ("watch", "notifications.notifyqueue.io", True),
        ("patch", "notifications.notifyqueue.io", True),
        ("delete", "notifications.notifyqueue.io", True),
        ("patch", "notifications.notifyqueue.io/status", True),
        ("patch", "notificationpolicies.notifyqueue.io/status", True),
        ("get", "secrets", True),
        ("list", "deployments.apps", True),
        ("patch", "deployments.apps/scale", True),
        ("create", "events", True),
        # What it must not be able to do.
        ("create", "notifications.notifyqueue.io", False),
        ("delete", "notificationpolicies.notifyqueue.io", False),
        ("list", "secrets", False),
        ("watch", "secrets", False),
        ("create", "secrets", False),
        ("update", "secrets", False),
        ("patch", "secrets", False),
        ("delete", "secrets", False),
        ("patch", "deployments.apps", False),
        ("create", "deployments.apps", False),
        ("delete", "deployments.apps", False),
        ("update", "deployments.apps", False),
        ("update", "deployments.apps/scale", False),
        ("create", "pods", False),
        ("get", "pods", False),
        ("create", "pods/exec", False),
        ("get", "configmaps", False),
        ("create", "serviceaccounts/token", False),
        ("delete", "events", False),
        ("create", "customresourcedefinitions.apiextensions.k8s.io", False),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io", False),
        ("escalate", "clusterroles.rbac.authorization.k8s.io", False),
        ("impersonate", "users", False),
        ("create", "namespaces", False),
    ],
)
def test_the_operator_service_account_can_do_exactly_what_it_needs(
    release: Release, tools: Tools, kubeconfig: Path, verb: str, resource: str, allowed: bool
) -> None:
    # `can-i patch deployments/scale` would ask about a Deployment named "scale": a subresource
    # is its own flag.
    kind, _, subresource = resource.partition("/")
    result = tools.kubectl(
        "auth",
        "can-i",
        verb,
        kind,
        *([f"--subresource={subresource}"] if subresource else []),
        "-n",
        release.namespace,
        f"--as=system:serviceaccount:{release.namespace}:{OPERATOR_SA}",
        kubeconfig=kubeconfig,
        check=False,
    )
    assert result.stdout.strip() == ("yes" if allowed else "no"), (
        f"{verb} {resource}: {result.stdout}{result.stderr}"
    )


def test_the_api_and_worker_service_account_can_do_nothing(
    release: Release, tools: Tools, kubeconfig: Path
) -> None:
    rules = tools.kubectl(
        "auth",
        "can-i",
        "--list",
        "-n",
        release.namespace,
        f"--as=system:serviceaccount:{release.namespace}:{RELEASE}-notify-queue-workload",
        kubeconfig=kubeconfig,
    ).stdout
    granted = [
        line
        for line in rules.splitlines()[1:]
        if "notifyqueue.io" in line or "secrets" in line or "deployments" in line
    ]
    assert not granted, rules


def test_helm_upgrade_migrates_again_and_keeps_the_operators_replica_counts(
    release: Release, tools: Tools, kubeconfig: Path
) -> None:
    ns = release.namespace
    tools.kubectl(
        "scale",
        "deployment",
        f"{RELEASE}-notify-queue-worker-bulk",
        "--replicas=4",
        "-n",
        ns,
        kubeconfig=kubeconfig,
    )
    out, logs = _helm_with_hooks(
        tools,
        kubeconfig,
        ns,
        "upgrade",
        RELEASE,
        str(CHART),
        "--values",
        str(release.values_file),
        "--set",
        "workers.pools.bulk.maxReplicas=20",
    )
    assert len(logs) == 2 and "exists: kept as it is" in logs[0], logs
    assert "schema up to date (0 migrations applied)" in logs[1]
    bulk = _deployment(tools, kubeconfig, ns, "worker-bulk")
    assert bulk["metadata"]["annotations"]["notifyqueue.io/max-replicas"] == "20"
    assert bulk["spec"]["replicas"] == 4, "helm upgrade reset the replica count the operator set"
    assert "REVISION: 2" in out


def test_the_generated_api_token_is_kept_across_upgrades(
    release: Release, tools: Tools, kubeconfig: Path
) -> None:
    ns = release.namespace
    secret = f"{RELEASE}-notify-queue-api-token"
    token = _secret_value(tools, kubeconfig, ns, secret, "api-token")
    assert token and len(token) >= 32, "no token given: the hook generates one"
    (api,) = _deployment(tools, kubeconfig, ns, "api")["spec"]["template"]["spec"]["containers"]
    assert _container_environment(tools, kubeconfig, ns, api)["NOTIFY_QUEUE_API_TOKEN"] == token

    _helm_with_hooks(
        tools, kubeconfig, ns, "upgrade", RELEASE, str(CHART), "--values", str(release.values_file)
    )

    assert _secret_value(tools, kubeconfig, ns, secret, "api-token") == token, (
        "an upgrade changed the API token: every client would be locked out"
    )


PREVIOUS_RELEASE_COMMIT = "47fbd42"  # 0.1.0, whose chart rendered a generated token itself


def test_upgrading_a_0_1_0_release_keeps_its_generated_token(
    tools: Tools,
    cluster: LocalControlPlane,
    pg_server: EmbeddedPostgres,
    tmp_path: Path,
) -> None:
    archive = subprocess.run(
        ["git", "-C", str(CHART), "archive", PREVIOUS_RELEASE_COMMIT, "--", "."],
        capture_output=True,
        check=False,
        timeout=60,
    )
    if archive.returncode != 0:
        missing_component(
            "git history",
            f"0.1.0 ({PREVIOUS_RELEASE_COMMIT}) is not in this checkout (a shallow clone?)",
        )
    old_chart = tmp_path / "notify-queue-0.1.0"
    old_chart.mkdir()
    subprocess.run(["tar", "-x", "-C", str(old_chart)], input=archive.stdout, check=True)
    database = f"helm_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}")
    try:
        kubeconfig = cluster.kubeconfig
        ns = tools.namespace(kubeconfig, prefix="old")
        values = tmp_path / "values.yaml"
        values.write_text(yaml.safe_dump({"database": {"url": pg_server.url(database)}}))
        _helm_with_hooks(
            tools, kubeconfig, ns, "install", RELEASE, str(old_chart), "--values", str(values)
        )
        old_token = _secret_value(
            tools, kubeconfig, ns, f"{RELEASE}-notify-queue-secrets", "api-token"
        )
        assert old_token, "0.1.0 generated the token into its own Secret"

        _, logs = _helm_with_hooks(
            tools, kubeconfig, ns, "upgrade", RELEASE, str(CHART), "--values", str(values)
        )

        assert "created with the token of the release's previous Secret" in logs[0], logs
        (api,) = _deployment(tools, kubeconfig, ns, "api")["spec"]["template"]["spec"]["containers"]
        env = _container_environment(tools, kubeconfig, ns, api)
        assert env["NOTIFY_QUEUE_API_TOKEN"] == old_token, "the upgrade rotated the clients' token"
        # The new manifest renders no token; the old key stays in the chart-made Secret (Helm's
        # patch drops it from stringData, which never deletes a key of data), so a 0.1.0 pod
        # restarted during the rollout still finds it.
        assert (
            _secret_value(tools, kubeconfig, ns, f"{RELEASE}-notify-queue-secrets", "api-token")
            == old_token
        )
    finally:
        with psycopg.connect(pg_server.url(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


async def test_helm_uninstall_releases_the_notifications_and_removes_the_release(
    release: Release, tools: Tools, kubeconfig: Path
) -> None:
    # Objects the operator handled (the policy with its finalizer), then the operator is lost.
    apps = tools.namespace(kubeconfig, prefix="apps")
    operator = await OperatorThread(settings_for(release.database_url, apps), kubeconfig).start()
    try:
        tools.kubectl("apply", "-n", apps, "-f", "-", kubeconfig=kubeconfig, input=_APPS)
        handled = await eventually(lambda: _handled(tools, kubeconfig, apps), timeout=20)
    finally:
        await operator.stop()
    waiting_id = handled["waiting"]["status"]["notificationId"]

    _, logs = _helm_with_hooks(tools, kubeconfig, release.namespace, "uninstall", RELEASE, "--wait")
    assert any("released" in log for log in logs), logs
    # The Pending one was cancelled: nobody would have served it.
    with psycopg.connect(release.database_url) as conn:
        row = conn.execute(
            "SELECT status FROM nq_all_notifications WHERE id = %s", (waiting_id,)
        ).fetchone()
    assert row == ("CANCELLED",)
    # No finalizer is left, so with no operator the objects (and so their namespace, which the
    # namespace controller empties the same way) delete at once.
    objects = tools.json("get", "notif,npol", "-n", apps, kubeconfig=kubeconfig)["items"]
    assert len(objects) == 3 and all(not o["metadata"].get("finalizers") for o in objects)
    tools.kubectl(
        "delete",
        "notif,npol",
        "--all",
        "-n",
        apps,
        "--wait",
        "--timeout=30s",
        kubeconfig=kubeconfig,
    )
    assert tools.json("get", "notif,npol", "-n", apps, kubeconfig=kubeconfig)["items"] == []

    left = tools.json(
        "get",
        "deployments,services,serviceaccounts,secrets,roles,rolebindings",
        "-n",
        release.namespace,
        kubeconfig=kubeconfig,
    )["items"]
    # The migration and API-token Jobs stay (hooks are not part of the release's objects); the
    # uninstall Job is deleted once it succeeded, the API-token hook's RBAC once the install's
    # hooks had. The generated token's Secret stays too: Helm never owned it (NOTES say so).
    assert [
        (o["kind"], o["metadata"]["name"]) for o in left if RELEASE in o["metadata"]["name"]
    ] == [("Secret", f"{RELEASE}-notify-queue-api-token")]
    jobs = tools.json("get", "jobs", "-n", release.namespace, kubeconfig=kubeconfig)["items"]
    assert sorted(j["metadata"]["name"] for j in jobs) == [
        f"{RELEASE}-notify-queue-api-token",
        f"{RELEASE}-notify-queue-migrate",
    ]
    tools.kubectl(
        "get",
        "crd",
        "notifications.notifyqueue.io",
        "notificationpolicies.notifyqueue.io",
        kubeconfig=kubeconfig,
    )


_APPS = """
apiVersion: notifyqueue.io/v1alpha1
kind: Notification
metadata: {name: waiting}
spec: {channel: email, recipient: later@example.com, body: hi, delay: 1h}
---
apiVersion: notifyqueue.io/v1alpha1
kind: Notification
metadata: {name: refused}
spec: {channel: email, recipient: a@example.com, body: hi, policy: default,
       metadata: {blob: "%s"}}
---
apiVersion: notifyqueue.io/v1alpha1
kind: NotificationPolicy
metadata: {name: default}
spec: {rateLimit: {maxPerWindow: 5, window: 1h}}
""" % ("x" * 17_000)


async def _handled(tools: Tools, kubeconfig: Path, namespace: str) -> dict[str, Any] | None:
    items = tools.json("get", "notif,npol", "-n", namespace, kubeconfig=kubeconfig)["items"]
    by_name = {o["metadata"]["name"]: o for o in items}
    phases = {n: (o.get("status") or {}).get("phase") for n, o in by_name.items()}
    done = (
        phases.get("waiting") == "Pending"
        and phases.get("refused") == "Rejected"
        and len(items) == 3
        and all(o["metadata"].get("finalizers") for o in items if o["kind"] == "NotificationPolicy")
        and all((o.get("status") or {}).get("conditions") for o in items)
    )
    return by_name if done else None
