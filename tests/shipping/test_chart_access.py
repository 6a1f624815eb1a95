"""The chart's access and delivery choices, as `helm template` renders them with the real helm.

Closed by default: without a token given, the API reads one that a hook generates at install
(tests/shipping/test_chart_api_token.py) and cannot start without it; an open API is an explicit
`api.auth: open`. An optional NetworkPolicy admits only chosen namespaces to the API; another,
on unless turned off, denies the workers' egress but for DNS, the database and the internet
without the cluster's ranges and the cloud metadata address. The provider
is an explicit value, and a pool that would have to deliver a channel its provider cannot (smtp
and sms) fails the render; client URLs' allow-list (`outboundAllow`) reaches the workers. Each
role's `config` takes only that role's options. (The token kept across `helm upgrade`:
tests/shipping/test_chart_install.py.)
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from tests.shipping.support import CHART, Tools, named, of_kind

pytestmark = pytest.mark.kubernetes

SECRET = "nq-notify-queue-secrets"
URL = {"database.url": "postgresql://nq@db:5432/nq"}


def container(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (only,) = named(objects, kind, name)["spec"]["template"]["spec"]["containers"]
    return dict(only)


def env_named(c: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((e for e in c["env"] if e["name"] == name), None)


def secret_data(objects: list[dict[str, Any]]) -> dict[str, str]:
    secret = named(objects, "Secret", SECRET)
    data = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
    return data | dict(secret.get("stringData") or {})


def render_fails(tools: Tools, *settings: str) -> str:
    args = ["template", "nq", str(CHART)]
    for setting in settings:
        args += ["--set", setting]
    result = tools.helm(*args, check=False)
    assert result.returncode != 0, "the render succeeded"
    return result.stderr


# --- the API is closed by default --------------------------------------------------------------


def test_by_default_the_api_requires_a_token_that_is_generated_at_run_time(
    tools: Tools,
) -> None:
    objects = tools.template(set_values=URL)

    assert "api-token" not in secret_data(objects), "a rendered token changes on every render"
    ref = env_named(
        container(objects, "Deployment", "nq-notify-queue-api"), "NOTIFY_QUEUE_API_TOKEN"
    )
    assert ref is not None
    # Made by the api-token hook (tests/shipping/test_chart_api_token.py).
    assert ref["valueFrom"]["secretKeyRef"] == {
        "name": "nq-notify-queue-api-token",
        "key": "api-token",
    }, "the token must not be optional: without it the API would start open"


def test_a_given_api_token_is_the_one_in_the_secret(tools: Tools) -> None:
    objects = tools.template(set_values=URL | {"secrets.apiToken": "my-own-token"})

    assert secret_data(objects)["api-token"] == "my-own-token"


def test_with_an_existing_secret_its_api_token_key_is_required(tools: Tools) -> None:
    objects = tools.template(set_values={"existingSecret": "mine"})

    assert not [s for s in of_kind(objects, "Secret") if s["metadata"]["name"] == SECRET]
    ref = env_named(
        container(objects, "Deployment", "nq-notify-queue-api"), "NOTIFY_QUEUE_API_TOKEN"
    )
    assert ref is not None
    assert ref["valueFrom"]["secretKeyRef"] == {"name": "mine", "key": "api-token"}


def test_an_open_api_is_explicit_and_then_gets_no_token_at_all(tools: Tools) -> None:
    objects = tools.template(set_values=URL | {"api.auth": "open"})

    api = container(objects, "Deployment", "nq-notify-queue-api")
    assert env_named(api, "NOTIFY_QUEUE_API_TOKEN") is None
    assert "api-token" not in secret_data(objects)


def test_an_open_api_with_a_token_is_refused_as_contradictory(tools: Tools) -> None:
    stderr = render_fails(tools, "api.auth=open", "secrets.apiToken=t")

    assert "api.auth is open but secrets.apiToken is set" in stderr


def test_api_auth_takes_only_token_or_open(tools: Tools) -> None:
    stderr = render_fails(tools, "api.auth=none")

    assert "at '/api/auth'" in stderr


# --- NetworkPolicy ------------------------------------------------------------------------------


EGRESS = "nq-notify-queue-worker-egress"
API_POLICY = "nq-notify-queue-api"


def test_only_the_workers_egress_policy_unless_the_api_policy_is_asked_for(tools: Tools) -> None:
    policies = of_kind(tools.template(set_values=URL), "NetworkPolicy")
    assert [p["metadata"]["name"] for p in policies] == [EGRESS]


def test_the_workers_egress_policy_is_dropped_only_by_choice(tools: Tools) -> None:
    off = {"networkPolicy.egress.enabled": "false"}
    assert of_kind(tools.template(set_values=URL | off), "NetworkPolicy") == []


def test_the_workers_may_reach_dns_the_database_and_the_internet_but_not_the_cluster(
    tools: Tools,
) -> None:
    objects = tools.template(set_values=URL)
    policy = named(objects, "NetworkPolicy", EGRESS)
    selected = policy["spec"]["podSelector"]["matchLabels"]
    pods = {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
        for d in of_kind(objects, "Deployment")
    }
    chosen = sorted(name for name, labels in pods.items() if selected.items() <= labels.items())
    assert chosen == ["nq-notify-queue-worker-bulk", "nq-notify-queue-worker-urgent"]
    # Egress only, so nothing but these rules leaves a worker; ingress (/metrics) is untouched.
    assert policy["spec"]["policyTypes"] == ["Egress"]
    dns, database, internet = policy["spec"]["egress"]
    assert dns["ports"] == [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]
    (dns_peer,) = dns["to"]
    assert dns_peer["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "kube-system"
    }
    assert database["to"] == [{"podSelector": {}}]  # the release's namespace
    assert database["ports"] == [
        {"port": 5432, "protocol": "TCP"},
        {"port": 6432, "protocol": "TCP"},
    ]
    assert "ports" not in internet
    v4, v6 = (peer["ipBlock"] for peer in internet["to"])
    assert v4["cidr"] == "0.0.0.0/0" and v6["cidr"] == "::/0"
    assert {"169.254.169.254/32", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"} <= set(
        v4["except"]
    )
    assert {"fc00::/7", "fd00:ec2::254/128"} <= set(v6["except"])


def test_the_workers_egress_takes_the_clusters_own_ranges_and_more_rules(tools: Tools) -> None:
    objects = tools.template(
        "--set",
        "networkPolicy.egress.clusterCidrs={10.244.0.0/16,10.96.0.0/12}",
        "--set-json",
        'networkPolicy.egress.extraRules=[{"to":[{"namespaceSelector":{"matchLabels":'
        '{"kubernetes.io/metadata.name":"infra"}}}],"ports":[{"port":8080}]}]',
        set_values=URL,
    )
    *_, internet, extra = named(objects, "NetworkPolicy", EGRESS)["spec"]["egress"]
    v4, v6 = (peer["ipBlock"] for peer in internet["to"])
    assert v4["except"] == ["10.244.0.0/16", "10.96.0.0/12", "169.254.169.254/32"]
    assert v6["except"] == ["fd00:ec2::254/128"]
    assert extra["ports"] == [{"port": 8080}]


def test_the_network_policy_admits_only_the_chosen_namespaces_to_the_api_port(
    tools: Tools,
) -> None:
    objects = tools.template(
        "--set",
        "api.networkPolicy.allowedNamespaces={shop,billing}",
        set_values=URL | {"api.networkPolicy.enabled": "true"},
        namespace="notify",
    )

    policy = named(objects, "NetworkPolicy", API_POLICY)
    api_pod = named(objects, "Deployment", "nq-notify-queue-api")["spec"]["template"]
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert selected.items() <= api_pod["metadata"]["labels"].items()
    assert (
        named(objects, "Deployment", "nq-notify-queue-operator")["spec"]["template"]["metadata"][
            "labels"
        ]["app.kubernetes.io/component"]
        != selected["app.kubernetes.io/component"]
    )
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    (source,) = rule["from"]
    (expression,) = source["namespaceSelector"]["matchExpressions"]
    assert expression["key"] == "kubernetes.io/metadata.name"
    assert expression["operator"] == "In"
    assert sorted(expression["values"]) == ["billing", "notify", "shop"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]


# --- provider and outbound allow-list ---------------------------------------------------------


def worker_env(objects: list[dict[str, Any]], pool: str) -> dict[str, str]:
    c = container(objects, "Deployment", f"nq-notify-queue-worker-{pool}")
    return {e["name"]: e["value"] for e in c["env"] if "value" in e}


def test_the_default_provider_is_the_simulated_one_set_explicitly_on_every_worker(
    tools: Tools,
) -> None:
    objects = tools.template(set_values=URL)

    for pool in ("urgent", "bulk"):
        assert worker_env(objects, pool)["NOTIFY_QUEUE_PROVIDER"] == "simulated"


def test_provider_values_reach_the_workers_and_only_them(tools: Tools) -> None:
    objects = tools.template(
        "--set",
        "outboundAllow={10.0.0.0/8,hooks.internal}",
        set_values=URL
        | {
            "provider.type": "http",
            "provider.email": "smtp",
            "config.provider-url": "http://gateway.messaging.svc/send",
            "workers.config.smtp-host": "mail.messaging.svc",
        },
    )

    env = worker_env(objects, "urgent")
    assert env["NOTIFY_QUEUE_PROVIDER"] == "http"
    assert env["NOTIFY_QUEUE_EMAIL_PROVIDER"] == "smtp"
    assert "NOTIFY_QUEUE_SMS_PROVIDER" not in env
    assert env["NOTIFY_QUEUE_OUTBOUND_ALLOW"] == "10.0.0.0/8,hooks.internal"
    api = container(objects, "Deployment", "nq-notify-queue-api")
    assert env_named(api, "NOTIFY_QUEUE_OUTBOUND_ALLOW") is None
    assert env_named(api, "NOTIFY_QUEUE_PROVIDER") is None


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            ["provider.type=smtp", "config.smtp-host=mail"],
            "workers.pools.bulk serves sms, which the smtp provider cannot deliver",
        ),
        (
            ["provider.type=http"],
            "delivers email with the http provider, which needs config.provider-url",
        ),
        (
            ["provider.type=http", "config.provider-url=http://gw", "provider.email=smtp"],
            "delivers email with the smtp provider, which needs config.smtp-host",
        ),
    ],
)
def test_a_pool_its_provider_cannot_serve_fails_the_render(
    tools: Tools, settings: list[str], message: str
) -> None:
    assert message in render_fails(tools, *settings)


def test_an_smtp_install_with_email_only_pools_renders(tools: Tools) -> None:
    objects = tools.template(
        set_values=URL
        | {
            "provider.type": "smtp",
            "config.smtp-host": "mail.messaging.svc",
            "workers.pools.urgent.channels": "{email}",
            "workers.pools.bulk.channels": "{email}",
        }
    )

    assert worker_env(objects, "bulk")["NOTIFY_QUEUE_PROVIDER"] == "smtp"


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("api.config.rate-limit=5", "additional properties 'rate-limit' not allowed"),
        ("operator.config.backoff-base=1", "additional properties 'backoff-base' not allowed"),
        ("workers.config.max-attempts=3", "additional properties 'max-attempts' not allowed"),
        ("config.provider=http", "additional properties 'provider' not allowed"),
        ("config.outbound-allow=10.0.0.0/8", "additional properties 'outbound-allow' not allowed"),
    ],
)
def test_each_roles_config_takes_only_that_roles_options(
    tools: Tools, setting: str, message: str
) -> None:
    assert message in render_fails(tools, setting)
