"""examples/cloudnativepg/: a CloudNativePG Cluster, its transaction-mode Pooler, and the chart's
values that wire Notify Queue to both.

Without CloudNativePG's CRDs at hand the objects are checked for the structure their CRDs
require and for agreeing with each other (the Pooler names the Cluster; the values name the
Secret CloudNativePG makes for it and the Pooler's Service). The chart rendered with the values
shows the split docs/operations.md describes: every role pooled, the roles that LISTEN and the
migration direct, the password from CloudNativePG's Secret. tests/pooling runs the same settings
through a real PgBouncer.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.shipping.support import ROOT, Tools

EXAMPLE = ROOT / "examples" / "cloudnativepg"


def load(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((EXAMPLE / name).read_text())
    return document


def test_the_pooler_runs_pgbouncer_in_transaction_mode_in_front_of_the_clusters_primary() -> None:
    cluster, pooler = load("cluster.yaml"), load("pooler.yaml")
    for obj, kind in ((cluster, "Cluster"), (pooler, "Pooler")):
        assert (obj["apiVersion"], obj["kind"]) == ("postgresql.cnpg.io/v1", kind)
        assert "namespace" not in obj["metadata"]
    assert cluster["spec"]["instances"] >= 2  # a standby to fail over to
    assert cluster["spec"]["bootstrap"]["initdb"] == {"database": "app", "owner": "app"}
    assert pooler["spec"]["cluster"] == {"name": cluster["metadata"]["name"]}
    assert pooler["spec"]["type"] == "rw"
    assert pooler["spec"]["pgbouncer"]["poolMode"] == "transaction"
    parameters = pooler["spec"]["pgbouncer"]["parameters"]
    # CloudNativePG takes PgBouncer parameters as strings.
    assert all(isinstance(v, str) for v in parameters.values())
    servers = pooler["spec"]["instances"] * int(parameters["default_pool_size"])
    assert servers < int(cluster["spec"]["postgresql"]["parameters"]["max_connections"])


def test_the_values_use_the_clusters_app_secret_and_the_poolers_service() -> None:
    cluster, pooler, values = load("cluster.yaml"), load("pooler.yaml"), load("values.yaml")
    app_secret = f"{cluster['metadata']['name']}-app"
    database = values["database"]
    assert database["listenUrlFrom"] == {"secretName": app_secret, "key": "uri"}
    assert database["passwordFrom"] == {"secretName": app_secret, "key": "password"}
    pooled = urlsplit(database["url"])
    assert (pooled.hostname, pooled.password) == (pooler["metadata"]["name"], None)
    assert pooled.username == pooled.path.lstrip("/") == "app"
    assert values["config"]["database-prepared-statements"] == "off"


@pytest.mark.kubernetes
def test_the_chart_sends_the_pool_through_pgbouncer_and_listen_and_migrations_direct(
    tools: Tools,
) -> None:
    objects = tools.template(values=[EXAMPLE / "values.yaml"])
    app_secret = "notify-pg-app"
    seen: dict[str, dict[str, Any]] = {}
    for obj in objects:
        if obj["kind"] not in ("Deployment", "Job"):
            continue
        (container,) = obj["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}
        component = obj["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
        seen[f"{component}/{obj['metadata']['name']}"] = env
        if "NOTIFY_QUEUE_DATABASE_URL" not in env:
            continue  # the api-token hook has no database
        password = {"secretKeyRef": {"name": app_secret, "key": "password"}}
        assert env["PGPASSWORD"] == password, obj["metadata"]["name"]
        direct = {"secretKeyRef": {"name": app_secret, "key": "uri"}}
        if component in ("worker", "operator"):
            assert env["NOTIFY_QUEUE_LISTEN_DATABASE_URL"] == direct
        else:
            assert "NOTIFY_QUEUE_LISTEN_DATABASE_URL" not in env
        if component == "migrate":
            assert env["NOTIFY_QUEUE_DATABASE_URL"] == direct
        else:
            url = env["NOTIFY_QUEUE_DATABASE_URL"]["secretKeyRef"]
            assert url["key"] == "database-url" and url["name"] != app_secret
        if component in ("api", "worker", "operator", "migrate"):
            assert env["NOTIFY_QUEUE_DATABASE_PREPARED_STATEMENTS"] == "off"
    components = {name.split("/")[0] for name in seen}
    assert {"api", "worker", "operator", "migrate"} <= components, sorted(seen)
