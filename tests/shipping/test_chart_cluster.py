"""The rendered chart against a real kube-apiserver: every manifest passes a server-side dry run.

`kubectl apply --dry-run=server` runs the API server's validation, defaulting, strict field
validation and admission, Pod Security "restricted" included (the namespaces enforce and warn
about it), without storing anything. The Prometheus Operator's objects are checked against a
subset of its CRDs (tests/shipping/fixtures/monitoring-crds.yaml), and the chart is shown to skip
them on a cluster that does not serve monitoring.coreos.com/v1 (Helm reads the cluster's API
versions with --validate, as `helm install` does).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest

from tests.shipping.support import (
    CHART,
    CLUSTER_SCOPED,
    FULL_VALUES,
    MONITORING_CRDS,
    Tools,
    dump,
    of_kind,
    pod_specs,
)

pytestmark = pytest.mark.kubernetes

ENABLED = {"metrics.serviceMonitor.enabled": "true", "metrics.prometheusRule.enabled": "true"}


def _served(tools: Tools, kubeconfig: Path, group_version: str) -> bool:
    versions = tools.kubectl("api-versions", kubeconfig=kubeconfig).stdout.split()
    return group_version in versions


def _dry_run(tools: Tools, kubeconfig: Path, objects: list[dict[str, Any]], namespace: str) -> str:
    """Apply `objects` with --dry-run=server; return kubectl's warnings (stderr)."""
    placed = []
    for obj in objects:
        obj = copy.deepcopy(obj)
        if obj["kind"] not in CLUSTER_SCOPED:
            obj["metadata"].setdefault("namespace", namespace)
        placed.append(obj)
    result = tools.kubectl(
        "apply",
        "--dry-run=server",
        "--validate=strict",
        "-f",
        "-",
        input=dump(placed),
        kubeconfig=kubeconfig,
    )
    applied = [line for line in result.stdout.splitlines() if line.endswith("(server dry run)")]
    assert len(applied) == len(objects), result.stdout
    return result.stderr


@pytest.fixture(scope="module")
def monitoring_crds(tools: Tools, kubeconfig: Path) -> None:
    tools.kubectl("apply", "-f", str(MONITORING_CRDS), kubeconfig=kubeconfig)
    tools.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/servicemonitors.monitoring.coreos.com",
        "crd/prometheusrules.monitoring.coreos.com",
        kubeconfig=kubeconfig,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if _served(tools, kubeconfig, "monitoring.coreos.com/v1"):
            return
        time.sleep(0.2)
    raise AssertionError("monitoring.coreos.com/v1 is not served after its CRDs were established")


def test_monitoring_objects_are_skipped_on_a_cluster_without_the_prometheus_operator_crds(
    tools: Tools, kubeconfig: Path
) -> None:
    if _served(tools, kubeconfig, "monitoring.coreos.com/v1"):
        pytest.fail("this test must run before the monitoring CRDs are installed (module order)")
    objects = tools.template("--validate", set_values=ENABLED, kubeconfig=kubeconfig)
    assert not of_kind(objects, "ServiceMonitor") and not of_kind(objects, "PrometheusRule")
    notes = tools.helm(
        "install",
        "nq",
        str(CHART),
        "--dry-run=client",
        "--namespace",
        "demo",
        *[a for k, v in ENABLED.items() for a in ("--set", f"{k}={v}")],
        kubeconfig=kubeconfig,
    ).stdout
    assert "does not serve\nmonitoring.coreos.com/v1" in notes


def test_the_default_render_passes_a_server_side_dry_run_under_pod_security_restricted(
    tools: Tools, kubeconfig: Path
) -> None:
    namespace = tools.namespace(kubeconfig)
    objects = tools.template(namespace=namespace, kubeconfig=kubeconfig)
    warnings = _dry_run(tools, kubeconfig, objects, namespace)
    assert "PodSecurity" not in warnings and "Warning" not in warnings, warnings


@pytest.mark.usefixtures("monitoring_crds")
def test_the_full_render_passes_a_server_side_dry_run_with_the_monitoring_crds(
    tools: Tools, kubeconfig: Path
) -> None:
    namespace = tools.namespace(kubeconfig)
    # operator.watchNamespace in the full values: its Role lives there.
    if tools.kubectl("get", "namespace", "notify", check=False, kubeconfig=kubeconfig).returncode:
        tools.kubectl("create", "namespace", "notify", kubeconfig=kubeconfig)
    objects = tools.template(
        "--validate", values=[FULL_VALUES], namespace=namespace, kubeconfig=kubeconfig
    )
    assert of_kind(objects, "ServiceMonitor") and of_kind(objects, "PrometheusRule")
    warnings = _dry_run(tools, kubeconfig, objects, namespace)
    assert "Warning" not in warnings, warnings


def test_every_pod_the_chart_would_start_is_admitted_where_restricted_is_enforced(
    tools: Tools, kubeconfig: Path
) -> None:
    """Deployments only warn about Pod Security; the Pods they make are rejected. Make them."""
    namespace = tools.namespace(kubeconfig)
    pods = []
    for objects in (
        tools.template(namespace=namespace),
        tools.template(values=[FULL_VALUES], namespace=namespace),
    ):
        for name, spec in pod_specs(objects):
            pods.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name.lower().replace("/", "-"), "namespace": namespace},
                    "spec": spec,
                }
            )
    result = tools.kubectl(
        "create",
        "--dry-run=server",
        "-f",
        "-",
        input=dump(pods),
        kubeconfig=kubeconfig,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("created (server dry run)") == len(pods)


def test_the_notes_say_how_to_send_a_first_notification(tools: Tools, kubeconfig: Path) -> None:
    notes = tools.helm(
        "install",
        "nq",
        str(CHART),
        "--dry-run=client",
        "--namespace",
        "demo",
        kubeconfig=kubeconfig,
    ).stdout.split("NOTES:", 1)[1]
    assert "kind: Notification" in notes
    assert "kubectl get notif -n demo hello" in notes
    assert "curl -s -X POST http://127.0.0.1:8080/notifications" in notes
    # Closed by default: how to read the generated token, and no warning about an open API.
    assert (
        "TOKEN=$(kubectl get secret -n demo nq-notify-queue-api-token "
        "-o jsonpath='{.data.api-token}' | base64 -d)"
    ) in notes
    assert "A hook Job generated it at install" in notes
    assert "`helm uninstall` leaves it" in notes
    assert '-H "Authorization: Bearer $TOKEN"' in notes
    assert "api.auth is open" not in notes
    # The simulated provider is the default: NOTES say that it sends nothing anywhere.
    assert "The simulated provider sends nothing anywhere" in notes
    assert "PHASE goes Pending -> Sent, but with the simulated provider nothing was sent" in notes


def test_the_notes_warn_about_an_open_api_and_drop_the_simulation_caveat_for_real_providers(
    tools: Tools, kubeconfig: Path
) -> None:
    notes = tools.helm(
        "install",
        "nq",
        str(CHART),
        "--dry-run=client",
        "--namespace",
        "demo",
        "--set",
        "api.auth=open",
        "--set",
        "provider.type=http",
        "--set",
        "config.provider-url=http://gateway/send",
        kubeconfig=kubeconfig,
    ).stdout.split("NOTES:", 1)[1]
    assert "WARNING: api.auth is open" in notes
    assert "Authorization" not in notes
    assert "simulated" not in notes
    assert "PHASE goes Pending -> Sent once your provider has accepted the notification" in notes
