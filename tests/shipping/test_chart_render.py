"""The Helm chart as rendered, without a cluster: lint, values schema, and what the manifests say.

`helm lint --strict` and `helm template` with the default values and with every value set;
values.schema.json rejecting bad values with a message that names the value; the chart's CRDs
equal to crds/; and the promises of the chart read from its output: restricted pod security
everywhere, secrets only from Secrets, worker pools labelled and annotated for the operator and
never given a replica count, the migration as a hook, monitoring objects only with their CRDs.
"""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from notify_queue.cli import build_parser
from notify_queue.models import Channel
from notify_queue.operator.api_token import build_parser as token_parser
from notify_queue.operator.release import build_parser as release_parser
from notify_queue.providers.specs import load_provider_specs
from notify_queue.services.scaling import PoolConfig, pool_config_from_annotations
from notify_queue.settings import ROLE_SETTINGS, WorkerSettings
from tests.shipping.support import (
    CHART,
    FULL_VALUES,
    ROOT,
    Tools,
    helm_values_of_hooks,
    named,
    of_kind,
    pod_specs,
)

pytestmark = pytest.mark.kubernetes

RELEASE_MODULE = "notify_queue.operator.release"
TOKEN_MODULE = "notify_queue.operator.api_token"
WORKER_DEFAULT_CHANNELS = WorkerSettings.model_fields["channels"].get_default(
    call_default_factory=True
)


@pytest.fixture(scope="module")
def default_objects(tools: Tools) -> list[dict[str, Any]]:
    return tools.template()


@pytest.fixture(scope="module")
def full_objects(tools: Tools) -> list[dict[str, Any]]:
    return tools.template("--api-versions", "monitoring.coreos.com/v1", values=[FULL_VALUES])


# --- lint and schema -------------------------------------------------------------------------


@pytest.mark.parametrize("values", [[], [FULL_VALUES]], ids=["default values", "full values"])
def test_helm_lint_strict_passes(tools: Tools, values: list[Path]) -> None:
    args = ["lint", "--strict", str(CHART)] + [a for v in values for a in ("--values", str(v))]
    result = tools.helm(*args)
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "workers.pools.urgent.priorities={URGENT}",
            "at '/workers/pools/urgent/priorities/0': value must be one of 'HIGH', 'NORMAL', 'LOW'",
        ),
        ("config.log-format=xml", "at '/config/log-format': value must be one of 'text', 'json'"),
        ("config.concurency=5", "additional properties 'concurency' not allowed"),
        ("config.database-url=postgresql://x", "additional properties 'database-url' not allowed"),
        ("workers.config.batch-size=5000", "at '/workers/config/batch-size': maximum"),
        ("api.replicas=-1", "at '/api/replicas': minimum"),
        ("database.url=mysql://db/notify", "at '/database/url'"),
        ("secrets.webhookSecret=not-a-secret", "at '/secrets/webhookSecret'"),
        ("workers.pools.Urgent_Pool.priorities={HIGH}", "'Urgent_Pool' does not match pattern"),
        ("image.pullPolicy=Sometimes", "at '/image/pullPolicy'"),
        ("operator.watchNamespace=Not_A_Namespace", "at '/operator/watchNamespace'"),
        ("metrics.serviceMonitor.interval=soon", "at '/metrics/serviceMonitor/interval'"),
        ("unknownTopLevel=1", "additional properties 'unknownTopLevel' not allowed"),
        ("auth.existingSecret=Not_A_Secret", "at '/auth/existingSecret'"),
        ("auth.apiToken=t", "additional properties 'apiToken' not allowed"),
        ("tracing.env.OTEL_EXPORTER_OTLP_ENDPONT=x", "'OTEL_EXPORTER_OTLP_ENDPONT' not allowed"),
        ("workers.pools.bulk.channels={fax}", "at '/workers/pools/bulk/channels/0'"),
    ],
)
def test_the_values_schema_rejects_a_bad_value_and_names_it(
    tools: Tools, setting: str, message: str
) -> None:
    result = tools.helm("template", "nq", str(CHART), "--set", setting, check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            ["workers.pools.bulk.enabled=false"],
            "no enabled pool serves the NORMAL lane, so NORMAL notifications would never be sent",
        ),
        (
            ["workers.pools.bulk.config.webhook-dispatch=off"],
            "every enabled pool has webhook-dispatch off, so no webhook event would ever be POSTed",
        ),
        (
            ["workers.pools.urgent.minReplicas=20"],
            "workers.pools.urgent: minReplicas (20) must not exceed maxReplicas (10)",
        ),
        (
            [
                "provider.type=smtp",
                "provider.sms=http",
                "provider.push=http",
                "config.smtp-host=mail",
                "config.provider-url=http://gw/send",
            ],
            "workers.pools.bulk serves voice, which the smtp provider cannot deliver: set "
            "provider.type (http) or list the pool's channels without it",
        ),
        (
            [
                "providersFile.content.providers[0].name=gw",
                "providersFile.content.providers[0].type=simulated",
                "providersFile.content.providers[0].channels={email,sms,push}",
            ],
            "workers.pools.bulk serves voice, which no provider of providersFile.content lists",
        ),
        (["database.url="], "database.url is empty"),
        (["api.databaseUrlKey=pooled"], "api.databaseUrlKey (pooled) needs existingSecret"),
    ],
)
def test_values_that_cannot_work_together_fail_with_a_clear_message(
    tools: Tools, settings: list[str], message: str
) -> None:
    args = ["template", "nq", str(CHART)] + [a for s in settings for a in ("--set", s)]
    result = tools.helm(*args, check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_the_config_schema_is_generated_from_the_settings() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen-chart-schema.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "copy", [CHART / "crds", ROOT / "src" / "notify_queue" / "crds"], ids=["chart", "package"]
)
def test_the_charts_and_the_packages_crds_are_the_projects_crds(copy: Path) -> None:
    ours = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    theirs = sorted(p.name for p in copy.glob("*.yaml"))
    assert ours and theirs == ours, "run scripts/sync-chart-crds.sh"
    _, mismatch, errors = filecmp.cmpfiles(ROOT / "crds", copy, ours, shallow=False)
    assert not mismatch and not errors, (
        f"{mismatch + errors} differ; run scripts/sync-chart-crds.sh"
    )


# --- what the manifests promise ----------------------------------------------------------------


def test_the_default_render_has_every_component(default_objects: list[dict[str, Any]]) -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in default_objects}
    for expected in [
        ("Deployment", "nq-notify-queue-operator"),
        ("Deployment", "nq-notify-queue-api"),
        ("Service", "nq-notify-queue-api"),
        ("Deployment", "nq-notify-queue-worker-urgent"),
        ("Deployment", "nq-notify-queue-worker-bulk"),
        ("PodDisruptionBudget", "nq-notify-queue-api"),
        ("PodDisruptionBudget", "nq-notify-queue-worker-urgent"),
        ("PodDisruptionBudget", "nq-notify-queue-worker-bulk"),
        ("Job", "nq-notify-queue-migrate"),
        ("ServiceAccount", "nq-notify-queue-operator"),
        ("ClusterRole", "notify-queue-nq-notify-queue-operator"),
        ("ClusterRoleBinding", "notify-queue-nq-notify-queue-operator"),
        ("Secret", "nq-notify-queue-secrets"),
    ]:
        assert expected in kinds


def test_tracing_variables_reach_the_api_the_workers_and_the_operator_only_when_set(
    default_objects: list[dict[str, Any]], full_objects: list[dict[str, Any]]
) -> None:
    def otel(objects: list[dict[str, Any]]) -> dict[str, tuple[str, dict[str, str]]]:
        """Per container that runs a role: (the role, its OTEL_* variables)."""
        return {
            f"{name}/{c['name']}": (
                (c.get("args") or ["?"])[0],
                {v["name"]: v["value"] for v in c["env"] if v["name"].startswith("OTEL_")},
            )
            for name, spec in pod_specs(objects)
            for c in spec["containers"]
            if "env" in c
        }

    assert not any(env for _, env in otel(default_objects).values())  # off: not one variable
    wanted = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector.observability:4318",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.25",
    }
    roles = otel(full_objects)
    assert {role for role, _ in roles.values()} >= {"api", "worker", "operator"}
    for container, (role, env) in roles.items():
        assert env == (wanted if role in ("api", "worker", "operator") else {}), container


def test_the_operator_runs_alone_and_is_replaced_not_rolled(
    default_objects: list[dict[str, Any]],
) -> None:
    operator = named(default_objects, "Deployment", "nq-notify-queue-operator")
    assert operator["spec"]["replicas"] == 1
    assert operator["spec"]["strategy"] == {"type": "Recreate"}
    (container,) = operator["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["operator"]
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    env = {e["name"]: e.get("value") for e in container["env"]}
    port = next(p for p in container["ports"] if p["name"] == probe["port"])["containerPort"]
    assert env["NOTIFY_QUEUE_METRICS_PORT"] == str(port)  # where run_operator serves /healthz
    assert env["NOTIFY_QUEUE_HOST"] == "0.0.0.0"  # noqa: S104 - the probe reaches it from outside


def test_worker_pools_split_urgent_from_bulk_lanes(default_objects: list[dict[str, Any]]) -> None:
    pools = {
        d["metadata"]["labels"]["notifyqueue.io/worker-pool"]: d
        for d in of_kind(default_objects, "Deployment")
        if "notifyqueue.io/worker-pool" in d["metadata"]["labels"]
    }
    assert set(pools) == {"urgent", "bulk"}
    lanes = {}
    for name, deployment in pools.items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        flags = build_parser().parse_args(container["args"])
        assert flags.role == "worker"
        annotations = deployment["metadata"]["annotations"]
        # The operator scales on the lanes the workers serve: one value, two places.
        assert annotations["notifyqueue.io/priorities"] == flags.priorities
        lanes[name] = flags.priorities
        for key in ("min-replicas", "max-replicas", "target-depth-per-replica", "scale-down-delay"):
            assert annotations[f"notifyqueue.io/{key}"].isdigit()
        # The operator owns the replica count; the chart setting it would undo the scaling.
        assert "replicas" not in deployment["spec"]
        assert (
            deployment["spec"]["template"]["metadata"]["labels"]["notifyqueue.io/worker-pool"]
            == name
        )
    assert lanes == {"urgent": "HIGH", "bulk": "NORMAL,LOW"}


def _pool(objects: list[dict[str, Any]], name: str) -> tuple[PoolConfig, list[str]]:
    """The pool's lanes as the operator reads them, and the channels its workers serve."""
    deployment = named(objects, "Deployment", f"nq-notify-queue-worker-{name}")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    flags = build_parser().parse_args(container["args"])
    served = flags.channels.split(",") if flags.channels else WORKER_DEFAULT_CHANNELS
    return pool_config_from_annotations(deployment["metadata"]["annotations"]), served


def test_the_default_pools_serve_every_channel_voice_included(
    default_objects: list[dict[str, Any]],
) -> None:
    for name in ("urgent", "bulk"):
        config, served = _pool(default_objects, name)
        assert served == list(Channel), name
        assert config.channels == frozenset(Channel), name  # scaled on the voice backlog too


def test_a_pool_may_serve_voice_alone(tools: Tools) -> None:
    objects = tools.template(set_values={"workers.pools.bulk.channels": "{voice}"})
    config, served = _pool(objects, "bulk")
    assert served == ["voice"] and config.channels == frozenset({Channel.VOICE})


def test_worker_annotations_are_what_the_operators_scaling_rule_reads(
    full_objects: list[dict[str, Any]],
) -> None:
    from notify_queue.models import Priority

    urgent = named(full_objects, "Deployment", "notify-worker-urgent")
    config = pool_config_from_annotations(urgent["metadata"]["annotations"])
    assert config.priorities == frozenset({Priority.HIGH})
    assert (config.min_replicas, config.max_replicas, config.target_depth_per_replica) == (
        3,
        30,
        10,
    )
    assert config.scale_down_delay_seconds == 120


def test_every_pod_meets_pod_security_restricted_and_has_a_read_only_root(
    default_objects: list[dict[str, Any]], full_objects: list[dict[str, Any]]
) -> None:
    specs = list(pod_specs(default_objects)) + list(pod_specs(full_objects))
    assert len(specs) >= 9
    for name, spec in specs:
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True, name
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in spec["containers"] + spec.get("initContainers", []):
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0, name
            mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
            assert "/tmp" in mounts, f"{name}: a read-only root needs a writable /tmp"


def test_only_the_operator_gets_a_kubernetes_token(default_objects: list[dict[str, Any]]) -> None:
    for name, spec in pod_specs(default_objects):
        mounts_token = spec.get("automountServiceAccountToken", True)
        # The uninstall hook runs the operator's release step with the operator's account; the
        # install hook that generates the API token has an account of its own, with a Role on
        # that Secret (tests/shipping/test_chart_api_token.py).
        operator = name in {"Deployment/nq-notify-queue-operator", "Job/nq-notify-queue-release"}
        token_hook = name == "Job/nq-notify-queue-api-token"
        assert mounts_token is (operator or token_hook), name
        if operator:
            assert spec["serviceAccountName"] == "nq-notify-queue-operator", name
        if token_hook:
            assert spec["serviceAccountName"] == "nq-notify-queue-api-token", name


def test_secrets_reach_the_pods_only_through_secret_references(
    default_objects: list[dict[str, Any]], full_objects: list[dict[str, Any]]
) -> None:
    secret_options = {"DATABASE_URL", "API_TOKEN", "ADMIN_TOKEN", "WEBHOOK_SECRET", "SMTP_PASSWORD"}
    for objects in (default_objects, full_objects):
        for name, spec in pod_specs(objects):
            for container in spec["containers"]:
                env = container["env"]
                names = [e["name"] for e in env]
                assert len(names) == len(set(names)), f"{name}: duplicate variables {names}"
                for variable in env:
                    option = variable["name"].removeprefix("NOTIFY_QUEUE_")
                    if option in secret_options:
                        assert "value" not in variable, f"{name}: {variable['name']} in plain text"
                        assert "secretKeyRef" in variable["valueFrom"]
    database = [
        e
        for _, spec in pod_specs(full_objects)
        for c in spec["containers"]
        for e in c["env"]
        if e["name"] == "NOTIFY_QUEUE_DATABASE_URL"
    ]
    assert database and all(
        e["valueFrom"]["secretKeyRef"]["name"] == "notify-queue-secrets" for e in database
    ), "existingSecret must be used everywhere, the migration Job included"


def test_each_role_can_read_its_database_url_from_its_own_key(
    full_objects: list[dict[str, Any]],
) -> None:
    keys = {}
    for name, spec in pod_specs(full_objects):
        (container,) = spec["containers"]
        (url,) = [e for e in container["env"] if e["name"] == "NOTIFY_QUEUE_DATABASE_URL"]
        keys[name] = url["valueFrom"]["secretKeyRef"]["key"]
    assert keys["Deployment/notify-api"] == "pooled-database-url"
    assert keys["Job/notify-migrate"] == "direct-database-url"
    assert keys["Deployment/notify-worker-urgent"] == "database-url"


def test_every_variable_the_chart_sets_is_a_setting_that_the_role_accepts(
    default_objects: list[dict[str, Any]], full_objects: list[dict[str, Any]]
) -> None:
    from notify_queue.settings import load_settings

    every_option = {f for model in ROLE_SETTINGS.values() for f in model.model_fields}
    for objects in (default_objects, full_objects):
        for name, spec in pod_specs(objects):
            for container in spec["containers"]:
                variables: dict[str, str] = {}
                for variable in container["env"]:
                    if not variable["name"].startswith("NOTIFY_QUEUE_"):
                        continue
                    field = variable["name"].removeprefix("NOTIFY_QUEUE_").lower()
                    assert field in every_option, f"{name}: {variable['name']} is no setting"
                    variables[field] = variable.get("value") or {  # else from the Secret
                        "database_url": "postgresql://user@db:5432/notify",
                        "webhook_secret": "whsec_c2VjcmV0",
                    }.get(field, "secret")
                if container.get("command") == ["python", "-m", RELEASE_MODULE]:
                    # The uninstall hook: not a role, the operator's release step.
                    release_parser().parse_args(container["args"])
                    assert set(variables) <= {"database_url", "namespace"}, name
                    continue
                if container.get("command") == ["python", "-m", TOKEN_MODULE]:
                    # The install hook that generates the API token: no setting at all.
                    token_parser().parse_args(container["args"])
                    assert not variables, name
                    continue
                flags = vars(build_parser().parse_args(container["args"]))
                role = flags.pop("role")
                assert role in {"api", "worker", "operator", "migrate"}, name
                model = ROLE_SETTINGS[role]
                # The top-level `config` goes to every role; a role reads only its own options,
                # as the program does. What the program will do at start: build and validate.
                values = {k: v for k, v in variables.items() if k in model.model_fields}
                load_settings(model, **values, **{k: v for k, v in flags.items() if v is not None})


def test_the_migration_runs_as_a_hook_before_install_and_upgrade(
    default_objects: list[dict[str, Any]],
) -> None:
    job = named(default_objects, "Job", "nq-notify-queue-migrate")
    assert helm_values_of_hooks(job) == {"pre-install", "pre-upgrade"}
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["migrate"]
    # The ordinary Secret does not exist yet when hooks run: the Job reads a hook Secret made
    # just before it (a lower weight) and deleted when the hooks are done.
    ref = next(e for e in container["env"] if e["name"] == "NOTIFY_QUEUE_DATABASE_URL")
    secret = named(default_objects, "Secret", ref["valueFrom"]["secretKeyRef"]["name"])
    assert helm_values_of_hooks(secret) == {"pre-install", "pre-upgrade"}
    weight = int(secret["metadata"]["annotations"]["helm.sh/hook-weight"])
    assert weight < int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
    assert "hook-succeeded" in secret["metadata"]["annotations"]["helm.sh/hook-delete-policy"]


def test_uninstall_runs_the_release_step_before_anything_is_deleted(
    default_objects: list[dict[str, Any]], tools: Tools
) -> None:
    job = named(default_objects, "Job", "nq-notify-queue-release")
    assert helm_values_of_hooks(job) == {"pre-delete"}
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", RELEASE_MODULE]
    args = release_parser().parse_args(container["args"])
    assert args.operator_deployment == "nq-notify-queue-operator"
    # It may scale the operator's own Deployment, and only that one.
    role = named(default_objects, "Role", "nq-notify-queue-operator-self")
    assert {tuple(r["resourceNames"]) for r in role["rules"]} == {("nq-notify-queue-operator",)}
    # Without the hook (releaseOnUninstall: false) nothing of it renders.
    without = tools.template(set_values={"operator.releaseOnUninstall": "false"})
    names = {o["metadata"]["name"] for o in without}
    assert not names & {"nq-notify-queue-release", "nq-notify-queue-operator-self"}


def test_disruption_budgets_cover_the_api_and_every_pool(
    full_objects: list[dict[str, Any]],
) -> None:
    budgets = {
        b["metadata"]["name"]: b["spec"] for b in of_kind(full_objects, "PodDisruptionBudget")
    }
    assert set(budgets) == {
        "notify-api",
        "notify-worker-urgent",
        "notify-worker-bulk",
        "notify-worker-sms",
    }
    for name, spec in budgets.items():
        target = named(full_objects, "Deployment", name)
        selected = target["spec"]["template"]["metadata"]["labels"]
        assert spec["selector"]["matchLabels"].items() <= selected.items(), name


def test_a_terminating_api_pod_keeps_serving_until_the_service_has_dropped_it(
    tools: Tools, default_objects: list[dict[str, Any]]
) -> None:
    # The endpoints controller and the kubelet act on a deletion independently: without the
    # sleep, uvicorn closes its socket while the Service still routes to the pod (the upgrade
    # test lost creates that way). The sleep counts against the grace period, which grows by it.
    pod = next(
        d["spec"]["template"]["spec"]
        for d in of_kind(default_objects, "Deployment")
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "api"
    )
    (api,) = pod["containers"]
    assert api["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    assert pod["terminationGracePeriodSeconds"] == 35

    off = tools.template("--set", "api.preStopSleepSeconds=0")
    pod = next(
        d["spec"]["template"]["spec"]
        for d in of_kind(off, "Deployment")
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "api"
    )
    assert "lifecycle" not in pod["containers"][0]
    assert pod["terminationGracePeriodSeconds"] == 30


def _verbs(role: dict[str, Any], group: str, resource: str) -> set[str]:
    """What the role allows on `resource` of API group `group`, over all its rules."""
    return {
        verb
        for rule in role["rules"]
        if group in rule["apiGroups"] or "*" in rule["apiGroups"]
        if resource in rule["resources"] or "*" in rule["resources"]
        for verb in rule["verbs"]
    }


@pytest.mark.parametrize("render", ["default_objects", "full_objects"])
def test_the_operator_reads_secrets_by_name_and_scales_only_through_the_subresource(
    request: pytest.FixtureRequest, render: str
) -> None:
    objects: list[dict[str, Any]] = request.getfixturevalue(render)
    (role,) = [
        r
        for r in of_kind(objects, "ClusterRole") + of_kind(objects, "Role")
        if r["metadata"]["labels"].get("app.kubernetes.io/component") == "operator"
        and not r["metadata"]["name"].endswith("-self")
    ]
    # A Secret only by its name: no list or watch that would show every Secret in scope.
    assert _verbs(role, "", "secrets") == {"get"}
    # Deployments are read, never written: replicas go through the scale subresource.
    assert _verbs(role, "apps", "deployments") == {"list"}
    assert _verbs(role, "apps", "deployments/scale") == {"patch"}
    assert not any("*" in rule["verbs"] for rule in role["rules"])


def test_a_watched_namespace_gets_a_role_instead_of_a_cluster_role(
    full_objects: list[dict[str, Any]],
) -> None:
    assert not of_kind(full_objects, "ClusterRole")
    (role,) = [
        r for r in of_kind(full_objects, "Role") if not r["metadata"]["name"].endswith("-self")
    ]
    assert role["metadata"]["namespace"] == "notify"
    operator = named(full_objects, "Deployment", "notify-operator")
    env = {
        e["name"]: e.get("value")
        for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["NOTIFY_QUEUE_NAMESPACE"] == "notify"


def test_monitoring_objects_render_only_when_the_cluster_serves_their_api(tools: Tools) -> None:
    enabled = {"metrics.serviceMonitor.enabled": "true", "metrics.prometheusRule.enabled": "true"}
    without = tools.template(set_values=enabled)
    assert not of_kind(without, "ServiceMonitor") and not of_kind(without, "PrometheusRule")
    with_api = tools.template("--api-versions", "monitoring.coreos.com/v1", set_values=enabled)
    assert len(of_kind(with_api, "ServiceMonitor")) == 1
    (rule,) = of_kind(with_api, "PrometheusRule")
    alerts = {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}
    # Metric names from CONTRACT section 7.
    assert (
        'notify_queue_notifications{status="DEAD_LETTERED"'
        in alerts["NotifyQueueDeadLettersGrowing"]
    )
    assert "notify_queue_oldest_due_age_seconds" in alerts["NotifyQueueOldestDueTooOld"]
    assert 'notify_queue_webhook_events{state="failed"' in alerts["NotifyQueueWebhookFailures"]
    off = tools.template("--api-versions", "monitoring.coreos.com/v1")
    assert not of_kind(off, "ServiceMonitor") and not of_kind(off, "PrometheusRule")


def test_a_providers_file_becomes_a_configmap_every_worker_mounts_with_secrets_by_reference(
    tools: Tools, tmp_path: Path
) -> None:
    values = tmp_path / "providers.yaml"
    values.write_text(
        """
providersFile:
  content:
    providers:
      - {name: sms-main, type: http, channels: [sms, push, voice], url: "http://gw:8080/send",
         rateLimit: {perSecond: 50}}
      - {name: sms-backup, type: http, channels: [sms, push], url: "https://backup.example/s"}
      - {name: mail, type: smtp, channels: [email], host: smtp.infra,
         passwordFrom: {env: SMTP_PASSWORD}}
    chains: {sms: [sms-main, sms-backup]}
  env:
    - {name: SMTP_PASSWORD, secretName: mail-relay, key: password}
"""
    )
    objects = tools.template(values=[values])
    [configmap] = [
        o for o in of_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-providers")
    ]
    rendered = tmp_path / "rendered-providers.yaml"
    rendered.write_text(configmap["data"]["providers.yaml"])
    specs = load_provider_specs(rendered)  # what the worker will read, validated the same way
    assert specs.chain(Channel.SMS) == ["sms-main", "sms-backup"]
    workers = [s for name, s in pod_specs(objects) if "worker" in name]
    assert workers
    for spec in workers:
        [container] = spec["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["NOTIFY_QUEUE_PROVIDERS_FILE"]["value"].endswith("/providers.yaml")
        assert "NOTIFY_QUEUE_PROVIDER" not in env  # the file replaces the single provider
        assert env["SMTP_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": "mail-relay",
            "key": "password",
        }
        assert any(
            v.get("configMap", {}).get("name") == configmap["metadata"]["name"]
            for v in spec["volumes"]
        )
        assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"


def test_the_api_reads_the_providers_file_the_public_url_and_the_unsubscribe_secrets(
    tools: Tools, tmp_path: Path
) -> None:
    """The API verifies receipts with the workers' providers file and checks the unsubscribe
    links the workers sign (docs/receipts.md): both roles get the same file, URL and secrets,
    the secrets by reference only, the previous secret optional (present while a rotation lasts)
    and the files a provider names mounted from a Secret."""
    values = tmp_path / "receipts.yaml"
    values.write_text(
        """
publicUrl: https://notify.example.com
unsubscribe: {secretName: unsubscribe-keys}
providersFile:
  content:
    providers:
      - {name: mail, type: http, channels: [email, sms, push, voice], url: "http://gw:8080/send",
         receipts: {scheme: sendgrid, publicKeyFile: /etc/notify-queue/receipts/sendgrid.pem}}
  env:
    - {name: TWILIO_AUTH_TOKEN, secretName: twilio, key: auth-token}
  secretMounts:
    - {secretName: receipts-keys, mountPath: /etc/notify-queue/receipts}
"""
    )
    objects = tools.template(values=[values])
    specs = [(n, s) for n, s in pod_specs(objects) if n.endswith("-api") or "-worker-" in n]
    assert any(n.endswith("-api") for n, _ in specs) and any("-worker-" in n for n, _ in specs)
    for name, spec in specs:
        [container] = spec["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["NOTIFY_QUEUE_PROVIDERS_FILE"]["value"].endswith("/providers.yaml"), name
        assert env["NOTIFY_QUEUE_PUBLIC_URL"]["value"] == "https://notify.example.com", name
        assert env["NOTIFY_QUEUE_UNSUBSCRIBE_SECRET"]["valueFrom"]["secretKeyRef"] == {
            "name": "unsubscribe-keys",
            "key": "unsubscribe-secret",
        }
        assert env["NOTIFY_QUEUE_UNSUBSCRIBE_PREVIOUS_SECRET"]["valueFrom"]["secretKeyRef"] == {
            "name": "unsubscribe-keys",
            "key": "unsubscribe-previous-secret",
            "optional": True,
        }
        assert env["TWILIO_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "twilio"
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        keys = mounts["/etc/notify-queue/receipts"]
        assert keys["readOnly"] and volumes[keys["name"]]["secret"] == {
            "secretName": "receipts-keys"
        }
        assert "configMap" in volumes[mounts["/etc/notify-queue/providers"]["name"]]
    [api] = [
        o
        for o in of_kind(objects, "Deployment")
        if o["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "api"
    ]
    # A changed providers file rolls the API as it rolls the workers.
    assert "checksum/providers" in api["spec"]["template"]["metadata"]["annotations"]


def test_without_receipt_values_the_api_gets_no_providers_file_url_or_unsubscribe_secret(
    default_objects: list[dict[str, Any]],
) -> None:
    for name, spec in pod_specs(default_objects):
        names = {e["name"] for c in spec["containers"] for e in c.get("env", [])}
        assert not names & {
            "NOTIFY_QUEUE_PROVIDERS_FILE",
            "NOTIFY_QUEUE_PUBLIC_URL",
            "NOTIFY_QUEUE_UNSUBSCRIBE_SECRET",
            "NOTIFY_QUEUE_UNSUBSCRIBE_PREVIOUS_SECRET",
        }, name
