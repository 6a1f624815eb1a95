"""A deterministic chart, and where the API token comes from.

`helm template` with the same values is byte-identical every time, for the default values and
representative sets (GitOps tools render that way: a random value would keep an application out
of sync and rotate the token at each sync), and no template calls a function that draws a random
value, reads the clock or the cluster. The token's three sources render as promised: a Secret the
user names (`auth.existingSecret`, or the older `existingSecret`) renders no token and no hook; no
token given renders the hook Job with its own ServiceAccount and a Role on the token's Secret by
name. The hook's command (`python -m notify_queue.operator.api_token`) then runs as a real process
against the test kube-apiserver, with a token of the hook's ServiceAccount under the rendered
RBAC: it creates the Secret once, leaves it alone afterwards, adopts a 0.1.0 release's token, and
is refused any other Secret. (The test cluster has no kubelet, so the Job itself cannot run.)
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from notify_queue.devcluster import LocalControlPlane
from notify_queue.operator.api_token import build_parser as token_parser
from tests.shipping.support import CHART, FULL_VALUES, Tools, dump, named, of_kind

pytestmark = pytest.mark.kubernetes

URL = {"database.url": "postgresql://nq@db:5432/nq"}
TOKEN_MODULE = "notify_queue.operator.api_token"
HOOK = "nq-notify-queue-api-token"
GENERATED = "nq-notify-queue-api-token"
CHART_SECRET = "nq-notify-queue-secrets"


def _render_text(tools: Tools, *args: str) -> str:
    return tools.helm("template", "nq", str(CHART), "--namespace", "notify-queue", *args).stdout


def _api_env(objects: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    api = named(objects, "Deployment", "nq-notify-queue-api")
    (container,) = api["spec"]["template"]["spec"]["containers"]
    return next((e for e in container["env"] if e["name"] == name), None)


def _hook_objects(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["metadata"]["name"] == HOOK]


# --- determinism ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--values", str(FULL_VALUES), "--api-versions", "monitoring.coreos.com/v1"],
        ["--set", "auth.existingSecret=api-tokens"],
        ["--set", "existingSecret=mine"],
        ["--set", "secrets.apiToken=given", "--set", "secrets.adminToken=admin"],
        ["--set", "api.auth=open"],
        ["--set", "providersFile.content.providers[0].name=gw",
         "--set", "providersFile.content.providers[0].type=http",
         "--set", "providersFile.content.providers[0].url=http://gw/send",
         "--set", "providersFile.content.providers[0].channels={email,sms,push,voice}"],
    ],
    ids=["defaults", "full values", "auth.existingSecret", "existingSecret", "given tokens",
         "open", "providers file"],
)  # fmt: skip
def test_helm_template_twice_with_the_same_values_is_byte_identical(
    tools: Tools, args: list[str]
) -> None:
    first, second = _render_text(tools, *args), _render_text(tools, *args)

    assert first == second, "two renders of the same values differ"
    assert "kind: Deployment" in first


# Sprig and Helm functions whose output changes from one render to the next, or that read the
# cluster (`lookup` answers nothing under `helm template`, something else under install).
UNSTABLE = {
    "randAlphaNum", "randAlpha", "randNumeric", "randAscii", "randBytes", "randInt", "uuidv4",
    "now", "date", "dateInZone", "unixEpoch", "ago", "htmlDate", "htmlDateInZone", "dateModify",
    "mustDateModify", "genCA", "genCAWithKey", "genPrivateKey", "genSelfSignedCert",
    "genSelfSignedCertWithKey", "genSignedCert", "genSignedCertWithKey", "htpasswd", "bcrypt",
    "encryptAES", "lookup", "shuffle",
}  # fmt: skip


def test_no_template_calls_a_random_clock_or_cluster_function() -> None:
    found = []
    for template in sorted((CHART / "templates").glob("*")):
        text = template.read_text()
        for action in re.findall(r"{{-?(.*?)-?}}", text, flags=re.DOTALL):
            if action.strip().startswith("/*"):
                continue  # a comment may say why such a function is not used
            words = set(re.findall(r"[A-Za-z][A-Za-z0-9]*", re.sub(r'"[^"]*"', "", action)))
            found += [f"{template.name}: {w}" for w in sorted(words & UNSTABLE)]
    assert not found, found


def _checksums(text: str) -> set[str]:
    objects = [o for o in yaml.safe_load_all(text) if o]
    workers = [o for o in of_kind(objects, "Deployment") if "worker" in o["metadata"]["name"]]
    assert workers
    return {
        (w["spec"]["template"]["metadata"].get("annotations") or {}).get("checksum/providers", "")
        for w in workers
    }


def test_pod_checksums_cover_only_rendered_content(tools: Tools) -> None:
    def providers(url: str) -> list[str]:
        return [
            "--set", "providersFile.content.providers[0].name=gw",
            "--set", "providersFile.content.providers[0].type=http",
            "--set", f"providersFile.content.providers[0].url={url}",
            "--set", "providersFile.content.providers[0].channels={email,sms,push,voice}",
        ]  # fmt: skip

    text = _render_text(tools, *providers("http://gw/send"))

    (checksum,) = _checksums(text)  # one ConfigMap: the same sum on every pool
    assert re.fullmatch(r"[0-9a-f]{64}", checksum)
    assert _checksums(_render_text(tools, *providers("http://other/send"))) != {checksum}, (
        "a changed providers file must roll the workers"
    )
    assert _checksums(_render_text(tools)) == {""}, "no providers file, nothing to roll on"
    assert set(re.findall(r"checksum/[a-z-]+", text)) == {"checksum/providers"}


# --- where the token comes from ------------------------------------------------------------------


def test_by_default_a_hook_generates_the_token_into_a_secret_the_api_requires(
    tools: Tools,
) -> None:
    objects = tools.template(set_values=URL)

    chart_secret = named(objects, "Secret", CHART_SECRET)
    assert "api-token" not in (chart_secret.get("stringData") or {}), "nothing random rendered"
    ref = _api_env(objects, "NOTIFY_QUEUE_API_TOKEN")
    assert ref is not None
    assert ref["valueFrom"]["secretKeyRef"] == {"name": GENERATED, "key": "api-token"}, (
        "the token must not be optional: without it the API would start open"
    )
    hooks = {o["kind"]: o for o in _hook_objects(objects)}
    assert set(hooks) == {"ServiceAccount", "Role", "RoleBinding", "Job"}
    weights = {}
    for kind, obj in hooks.items():
        annotations = obj["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade", kind
        weights[kind] = int(annotations["helm.sh/hook-weight"])
    migrate = named(objects, "Job", "nq-notify-queue-migrate")
    migrate_secret = named(objects, "Secret", "nq-notify-queue-migrate")
    assert weights["ServiceAccount"] == weights["Role"] == weights["RoleBinding"] < weights["Job"]
    assert weights["Job"] < int(migrate_secret["metadata"]["annotations"]["helm.sh/hook-weight"])
    assert weights["Job"] < int(migrate["metadata"]["annotations"]["helm.sh/hook-weight"])
    # The RBAC exists only while the hooks run; the Job stays for its log.
    for kind in ("ServiceAccount", "Role", "RoleBinding"):
        policy = hooks[kind]["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
        assert {"hook-succeeded", "hook-failed"} <= set(policy.split(",")), kind
    role = hooks["Role"]
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": [GENERATED, CHART_SECRET],
            "verbs": ["get"],
        },
        # RBAC cannot narrow create to a name.
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    ]
    binding = hooks["RoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": HOOK, "namespace": "notify-queue"}
    ]
    pod = hooks["Job"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == HOOK and pod["automountServiceAccountToken"] is True
    (container,) = pod["containers"]
    assert container["command"] == ["python", "-m", TOKEN_MODULE]
    args = token_parser().parse_args(container["args"])
    assert (args.namespace, args.secret, args.adopt_from) == (
        "notify-queue",
        GENERATED,
        CHART_SECRET,
    )
    # Argo CD's label tracking must not adopt (and prune) the Secret the hook makes.
    assert "app.kubernetes.io/instance" not in dict(args.label)


@pytest.mark.parametrize(
    ("settings", "secret"),
    [
        ({"auth.existingSecret": "api-tokens"}, "api-tokens"),
        ({"existingSecret": "mine"}, "mine"),
        ({"existingSecret": "mine", "auth.existingSecret": "api-tokens"}, "api-tokens"),
    ],
    ids=["auth.existingSecret", "existingSecret", "both"],
)
def test_a_named_secret_is_referenced_and_nothing_is_generated(
    tools: Tools, settings: dict[str, str], secret: str
) -> None:
    objects = tools.template(set_values=URL | settings)

    assert not _hook_objects(objects)
    assert not [s for s in of_kind(objects, "Secret") if s["metadata"]["name"] == GENERATED]
    token = _api_env(objects, "NOTIFY_QUEUE_API_TOKEN")
    assert token is not None
    assert token["valueFrom"]["secretKeyRef"] == {"name": secret, "key": "api-token"}
    admin = _api_env(objects, "NOTIFY_QUEUE_ADMIN_TOKEN")
    assert admin is not None
    assert admin["valueFrom"]["secretKeyRef"] == {
        "name": secret,
        "key": "admin-token",
        "optional": True,
    }
    for chart_secret in of_kind(objects, "Secret"):
        data = chart_secret.get("stringData") or {}
        assert "api-token" not in data and "admin-token" not in data
    # The database URL still comes from where it did.
    url = _api_env(objects, "NOTIFY_QUEUE_DATABASE_URL")
    assert url is not None
    assert url["valueFrom"]["secretKeyRef"]["name"] == settings.get("existingSecret", CHART_SECRET)


def test_a_given_token_goes_into_the_chart_secret_and_nothing_is_generated(tools: Tools) -> None:
    objects = tools.template(set_values=URL | {"secrets.apiToken": "my-own-token"})

    assert not _hook_objects(objects)
    assert named(objects, "Secret", CHART_SECRET)["stringData"]["api-token"] == "my-own-token"
    ref = _api_env(objects, "NOTIFY_QUEUE_API_TOKEN")
    assert ref is not None
    assert ref["valueFrom"]["secretKeyRef"] == {"name": CHART_SECRET, "key": "api-token"}


def test_an_open_api_generates_nothing(tools: Tools) -> None:
    objects = tools.template(set_values=URL | {"api.auth": "open"})

    assert not _hook_objects(objects)
    assert _api_env(objects, "NOTIFY_QUEUE_API_TOKEN") is None


def test_tokens_both_given_and_named_are_refused(tools: Tools) -> None:
    for given in ("secrets.apiToken=t", "secrets.adminToken=t"):
        result = tools.helm(
            "template", "nq", str(CHART), "--set", "auth.existingSecret=x", "--set", given,
            check=False,
        )  # fmt: skip
        assert result.returncode != 0
        assert "auth.existingSecret (x) holds the API tokens" in result.stderr, result.stderr


def test_values_of_0_1_0_without_auth_still_render(tools: Tools, tmp_path: Path) -> None:
    # `helm upgrade --reuse-values` from 0.1.0 renders with the old release's values: no `auth`.
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    del values["auth"]
    copy = tmp_path / "chart"
    subprocess.run(["cp", "-r", str(CHART), str(copy)], check=True)
    (copy / "values.yaml").write_text(yaml.safe_dump(values))
    result = tools.helm("template", "nq", str(copy), "--set", "database.url=postgresql://db/nq")
    ref = _api_env([o for o in yaml.safe_load_all(result.stdout) if o], "NOTIFY_QUEUE_API_TOKEN")
    assert ref is not None
    assert ref["valueFrom"]["secretKeyRef"]["name"] == GENERATED


# --- the hook's command against a real kube-apiserver ---------------------------------------------


def _hook_kubeconfig(tools: Tools, admin: Path, namespace: str, path: Path) -> Path:
    """A kubeconfig with a token of the hook's ServiceAccount, as its pod would mount."""
    token = tools.kubectl(
        "create", "token", HOOK, "-n", namespace, "--duration=1h", kubeconfig=admin
    ).stdout.strip()
    config = json.loads(admin.read_text())
    config["users"] = [{"name": HOOK, "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = HOOK
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


def _run_hook(
    job: dict[str, Any], kubeconfig: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    """The Job's container command, run as its pod would run it (but with a kubeconfig)."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return subprocess.run(
        [sys.executable, *container["command"][1:], *container["args"], *extra,
         "--kubeconfig", str(kubeconfig)],
        env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _token(tools: Tools, kubeconfig: Path, namespace: str, name: str) -> str | None:
    result = tools.kubectl(
        "get", "secret", name, "-n", namespace, "-o", "json", kubeconfig=kubeconfig, check=False
    )
    if result.returncode != 0:
        return None
    data = json.loads(result.stdout).get("data") or {}
    return base64.b64decode(data["api-token"]).decode() if "api-token" in data else None


@pytest.fixture
def hook_namespace(
    tools: Tools, cluster: LocalControlPlane, tmp_path: Path
) -> tuple[str, dict[str, Any], Path]:
    """A namespace with the hook's ServiceAccount, Role and RoleBinding as the chart renders
    them; the rendered Job, and a kubeconfig with the hook's ServiceAccount token."""
    admin = cluster.kubeconfig
    namespace = tools.namespace(admin, prefix="token")
    objects = tools.template(set_values=URL, namespace=namespace)
    hook = _hook_objects(objects)
    rbac = [o for o in hook if o["kind"] != "Job"]
    tools.kubectl("apply", "-f", "-", input=dump(rbac), kubeconfig=admin)
    (job,) = of_kind(hook, "Job")
    return namespace, job, _hook_kubeconfig(tools, admin, namespace, tmp_path / "kubeconfig")


def test_the_hook_creates_the_token_once_and_then_leaves_it_alone(
    tools: Tools, kubeconfig: Path, hook_namespace: tuple[str, dict[str, Any], Path]
) -> None:
    namespace, job, hook_config = hook_namespace

    first = _run_hook(job, hook_config)
    assert first.returncode == 0, first.stderr
    assert "created with a new token" in first.stdout
    token = _token(tools, kubeconfig, namespace, GENERATED)
    assert token is not None and len(token) == 48 and token.isalnum()
    assert token not in first.stdout + first.stderr, "the token must not reach the Job's log"
    secret = tools.json("get", "secret", GENERATED, "-n", namespace, kubeconfig=kubeconfig)
    labels = secret["metadata"].get("labels") or {}
    assert "app.kubernetes.io/instance" not in labels
    assert labels["notifyqueue.io/release"] == "nq"
    assert "helm uninstall leaves it" in secret["metadata"]["annotations"]["notifyqueue.io/note"]

    second = _run_hook(job, hook_config)  # the next upgrade
    assert second.returncode == 0, second.stderr
    assert "exists: kept as it is" in second.stdout
    assert _token(tools, kubeconfig, namespace, GENERATED) == token, "an upgrade rotated it"
    again = tools.json("get", "secret", GENERATED, "-n", namespace, kubeconfig=kubeconfig)
    assert again["metadata"]["resourceVersion"] == secret["metadata"]["resourceVersion"], (
        "the hook wrote to a Secret that existed"
    )


def test_the_hook_keeps_the_token_of_a_0_1_0_release(
    tools: Tools, kubeconfig: Path, hook_namespace: tuple[str, dict[str, Any], Path]
) -> None:
    namespace, job, hook_config = hook_namespace
    # 0.1.0's chart rendered the generated token into its own Secret.
    tools.kubectl(
        "create", "secret", "generic", CHART_SECRET, "-n", namespace,
        "--from-literal=database-url=postgresql://db/nq", "--from-literal=api-token=OldToken010",
        kubeconfig=kubeconfig,
    )  # fmt: skip

    run = _run_hook(job, hook_config)

    assert run.returncode == 0, run.stderr
    assert "the token of the release's previous Secret" in run.stdout
    assert _token(tools, kubeconfig, namespace, GENERATED) == "OldToken010"


def test_a_secret_made_by_hand_without_the_key_is_an_error_and_left_alone(
    tools: Tools, kubeconfig: Path, hook_namespace: tuple[str, dict[str, Any], Path]
) -> None:
    namespace, job, hook_config = hook_namespace
    tools.kubectl(
        "create", "secret", "generic", GENERATED, "-n", namespace, "--from-literal=other=x",
        kubeconfig=kubeconfig,
    )  # fmt: skip

    run = _run_hook(job, hook_config)

    assert run.returncode == 1
    assert f"Secret {namespace}/{GENERATED} exists without an api-token key" in run.stderr
    assert _token(tools, kubeconfig, namespace, GENERATED) is None


@pytest.mark.parametrize(
    ("verb", "resource", "allowed"),
    [
        ("get", f"secrets/{GENERATED}", True),
        ("get", f"secrets/{CHART_SECRET}", True),
        ("create", "secrets", True),  # RBAC cannot narrow create to a name
        ("get", "secrets/someone-elses", False),
        ("list", "secrets", False),
        ("watch", "secrets", False),
        ("update", f"secrets/{GENERATED}", False),
        ("patch", f"secrets/{GENERATED}", False),
        ("delete", f"secrets/{GENERATED}", False),
        ("get", "configmaps", False),
        ("create", "pods", False),
    ],
)
def test_the_hooks_service_account_can_read_only_the_token_secrets(
    tools: Tools,
    hook_namespace: tuple[str, dict[str, Any], Path],
    verb: str,
    resource: str,
    allowed: bool,
) -> None:
    namespace, _, hook_config = hook_namespace
    result = tools.kubectl(
        "auth", "can-i", verb, resource, "-n", namespace, kubeconfig=hook_config, check=False
    )
    assert result.stdout.strip() == ("yes" if allowed else "no"), (
        f"{verb} {resource}: {result.stdout}{result.stderr}"
    )


def test_the_hook_pointed_at_another_secret_is_refused(
    tools: Tools, kubeconfig: Path, hook_namespace: tuple[str, dict[str, Any], Path]
) -> None:
    namespace, job, hook_config = hook_namespace
    tools.kubectl(
        "create", "secret", "generic", "someone-elses", "-n", namespace,
        "--from-literal=api-token=NotYours", kubeconfig=kubeconfig,
    )  # fmt: skip

    # argparse takes the last --secret: the rendered Job's command aimed at another Secret.
    run = _run_hook(job, hook_config, "--secret=someone-elses")

    assert run.returncode == 1
    assert "HTTP 403" in run.stderr, run.stderr
    assert "NotYours" not in run.stdout + run.stderr


@pytest.mark.parametrize(
    ("settings", "secret", "generated"),
    [
        ([], GENERATED, True),
        (["--set", "auth.existingSecret=api-tokens"], "api-tokens", False),
        (["--set", "existingSecret=mine"], "mine", False),
    ],
    ids=["generated", "auth.existingSecret", "existingSecret"],
)
def test_the_notes_say_where_to_read_the_token(
    tools: Tools, kubeconfig: Path, settings: list[str], secret: str, generated: bool
) -> None:
    out = tools.helm(
        "install", "nq", str(CHART), "--dry-run=client", "--namespace", "demo", *settings,
        kubeconfig=kubeconfig,
    ).stdout  # fmt: skip
    notes = out.split("NOTES:", 1)[1]

    assert (
        f"TOKEN=$(kubectl get secret -n demo {secret} -o jsonpath='{{.data.api-token}}' "
        "| base64 -d)"
    ) in notes
    assert ("`helm uninstall` leaves it" in notes) is generated
