"""The Grafana dashboard (charts/notify-queue/dashboards/notify-queue.json) against the code.

Every metric a panel's query names is one the roles export: the names are read from the
/metrics of a live `notify-queue api` and `notify-queue worker` (and the operator's registry,
which needs Kubernetes to serve), never from a hand-kept list. The copy under docs/ is the
chart's, byte for byte. The chart renders the dashboard into a ConfigMap for Grafana's sidecar
only when asked. And a real Prometheus (Debian's package, scripts/install-prometheus.sh) scraping
a live API and worker every second, after traffic of every kind (sent, failed for good, timed
out until a circuit opens, repeats, conflicts, invalid requests, webhooks refused then taken),
evaluates every panel's query, with the dashboard's variables substituted, to a result with a
number in it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY, generate_latest

from notify_queue.embedded import EmbeddedPostgres
from tests.conftest import cloned_database
from tests.shipping.dashboard import (
    NAMESPACE,
    PENDING_METRICS,
    ROOT,
    Query,
    exported_names,
    has_a_number,
    live_roles,
    load_dashboard,
    metric_names,
    panel_queries,
    prometheus_binary,
    running_prometheus,
)
from tests.shipping.support import CHART, Tools, named
from tests.support import (
    MIN_DEADLINE_SECONDS,
    directory_outside_pytest,
    eventually,
    missing_component,
)


@pytest.fixture
def queries() -> list[Query]:
    return panel_queries(load_dashboard())


# --- the JSON itself ---------------------------------------------------------------------------


def test_the_metric_name_parser_finds_names_and_nothing_else() -> None:
    expr = (
        'histogram_quantile(0.9, sum by (le, priority) (rate(a_bucket{namespace=~"$ns",x="b c"}'
        "[$__rate_interval]))) / on (job) group_left (pod)"
        " max without (instance) (b_total offset 5m) > bool 0 or vector(1) and c:recorded"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c:recorded"}


def test_every_panel_queries_the_datasource_variable_and_every_row_has_panels() -> None:
    dashboard = load_dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == [
        "Intake",
        "Depth and oldest due per lane",
        "Why notifications wait",
        "Sends and failures per provider",
        "Circuits",
        "Latency (due → sent)",
        "Webhook relay",
        "Database pool",
        "Delivery receipts",
    ]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]
            assert 'namespace=~"$namespace"' in target["expr"], panel["title"]


def test_the_docs_copy_and_panel_reference_are_the_charts_dashboard() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen-dashboard-docs.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"{result.stderr} (make docs)"


# --- names against the code --------------------------------------------------------------------


async def test_every_metric_a_panel_queries_is_exported_by_the_roles(
    pg_server: EmbeddedPostgres, queries: list[Query]
) -> None:
    import notify_queue.operator.metrics  # noqa: F401 - registers the operator's metrics

    exported = exported_names(generate_latest(REGISTRY).decode())
    with (
        cloned_database(pg_server, "dash_names") as url,
        directory_outside_pytest("nq-dashboard-") as directory,
    ):
        async with live_roles(url, directory) as roles:
            # Labelled series appear with their first event; the families are there at once.
            for text in (await roles.scrape()).values():
                exported |= exported_names(text)
    unknown = {
        (q.panel, name)
        for q in queries
        for name in metric_names(q.expr)
        if name not in exported and name not in PENDING_METRICS
    }
    assert not unknown, f"panels query metrics no role exports: {sorted(unknown)}"
    # A pending metric is one a panel uses before its issue lands; once a role exports it, its
    # entry in PENDING_METRICS goes, and the Prometheus test then evaluates its panel too.
    landed = set(PENDING_METRICS) & exported
    assert not landed, f"{landed} exported now: drop them from PENDING_METRICS"
    assert "notify_queue_creates_total" in exported  # the scrape did reach the roles


def test_pending_metrics_are_ones_a_panel_queries() -> None:
    used = {name for q in panel_queries(load_dashboard()) for name in metric_names(q.expr)}
    assert set(PENDING_METRICS) <= used


# --- the chart ---------------------------------------------------------------------------------


@pytest.mark.kubernetes
def test_the_chart_renders_the_dashboard_for_grafanas_sidecar_only_when_enabled(
    tools: Tools,
) -> None:
    assert not [
        o
        for o in tools.template()
        if o["kind"] == "ConfigMap" and "dashboard" in o["metadata"]["name"]
    ]
    objects: list[dict[str, Any]] = tools.template(
        set_values={
            "grafanaDashboard.enabled": "true",
            "grafanaDashboard.namespace": "monitoring",
            "grafanaDashboard.annotations.grafana_folder": "Notify Queue",
        }
    )
    config_map = named(objects, "ConfigMap", "nq-notify-queue-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Notify Queue"}
    assert config_map["data"]["notify-queue.json"] == (
        CHART / "dashboards" / "notify-queue.json"
    ).read_text().rstrip("\n")


# --- a real Prometheus -------------------------------------------------------------------------


async def test_prometheus_evaluates_every_panel_query_after_traffic(
    pg_server: EmbeddedPostgres, queries: list[Query]
) -> None:
    binary = prometheus_binary()
    if binary is None:
        missing_component("prometheus", "scripts/install-prometheus.sh could not install it here")
    with (
        cloned_database(pg_server, "dash_prom") as url,
        directory_outside_pytest("nq-dashboard-") as directory,
    ):
        async with (
            live_roles(url, directory) as roles,
            running_prometheus(
                binary,
                directory,
                {"notify-queue-api": roles.api_target, "notify-queue-worker": roles.worker_target},
            ) as prometheus,
        ):
            exported = set().union(*(exported_names(t) for t in (await roles.scrape()).values()))
            pending = {
                q for q in queries if metric_names(q.expr) & (set(PENDING_METRICS) - exported)
            }
            to_check = [q for q in queries if q not in pending]
            answers: dict[Query, Any] = {}

            async def every_query_has_a_number() -> bool:
                async with httpx.AsyncClient(base_url=prometheus, timeout=30) as http:
                    for query in to_check:
                        if query in answers and has_a_number(answers[query]):
                            continue
                        answer = await http.get(
                            "/api/v1/query", params={"query": query.substituted()}
                        )
                        body = answer.json()
                        assert body["status"] == "success", (query, body)
                        answers[query] = body["data"]["result"]
                return all(has_a_number(answers[q]) for q in to_check)

            started = time.monotonic()
            try:
                await eventually(
                    every_query_has_a_number,
                    timeout=max(180, MIN_DEADLINE_SECONDS),
                    interval=1.0,
                    what="a number from every panel query",
                )
            except AssertionError:
                empty = [(q.panel, q.ref) for q in to_check if not has_a_number(answers.get(q, []))]
                logs = {
                    name: (directory / name).read_text()[-2000:]
                    for name in ("api.log", "worker.log", "prometheus.log")
                }
                raise AssertionError(
                    f"no number after {time.monotonic() - started:.0f}s from {empty}; "
                    f"traffic {roles.traffic.answers} in {roles.traffic.rounds} rounds; "
                    f"the logs' ends: {logs}"
                ) from None
            # The namespace variable's own query (label_values) finds the namespace too.
            async with httpx.AsyncClient(base_url=prometheus, timeout=30) as http:
                values = await http.get(
                    "/api/v1/label/namespace/values",
                    params={"match[]": "notify_queue_queue_depth"},
                )
            assert values.json()["data"] == [NAMESPACE]
    assert len(to_check) + len(pending) == len(queries)
    assert not pending or all(metric_names(q.expr) & set(PENDING_METRICS) for q in pending), (
        "only panels of pending metrics are left out"
    )
    # Every kind of traffic happened: the queries above saw its figures.
    assert {201, 200, 409, 400} <= set(roles.traffic.answers)
