"""The kubectl and helm commands of docs/quickstart.md, docs/operations.md and docs/upgrading.md
name objects that the chart really makes for the release those pages use.

The quickstart's first part runs as written (test_quickstart.py); its Helm part and the
operations and upgrading commands need a cluster with nodes, so here every command is taken from
the pages (fenced blocks and inline code), and each object it names (`job/…`, `deploy/…`,
`deployment/…`, `svc/…`, `secret …`), each label selector on the release, each namespace and each
chart path is checked against `helm template` of the chart with the quickstart's own `helm
install` values and with the defaults. The image the quickstart builds and pushes must be the one
the chart runs (its appVersion).
"""

from __future__ import annotations

import re
import shlex
import subprocess
from typing import Any

import pytest
import yaml

from tests.shipping.support import CHART, ROOT, Tools

pytestmark = pytest.mark.kubernetes

PAGES = ("quickstart.md", "operations.md", "upgrading.md")
RELEASE = NAMESPACE = "notify-queue"
_FENCED = re.compile(r"```(?:sh|bash)?\n(.*?)```", re.S)
_INLINE = re.compile(r"`([^`\n]+)`")
_SLASHED = re.compile(r"(?:^|\s)(job|deploy|deployment|svc|service|secret)/([a-z0-9][a-z0-9.-]*)")
_FLAGS_WITH_VALUES = {"-n", "--namespace", "-o", "--output", "-l", "--selector", "-f", "--context"}
_KINDS = {
    "job": "Job",
    "deploy": "Deployment",
    "deployment": "Deployment",
    "svc": "Service",
    "service": "Service",
    "secret": "Secret",
}


def commands(page: str) -> list[str]:
    """Every kubectl or helm command line of a page: from its fenced blocks (continuation lines
    joined) and from its inline code."""
    text = (ROOT / "docs" / page).read_text()
    if page == "quickstart.md":  # its first part runs against `up --kubernetes`, not the chart
        text = text[text.index("## 2. ") :]
    found = []
    for block in _FENCED.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line.startswith(("kubectl ", "helm ")):
                found.append(line)
    for span in _INLINE.findall(_FENCED.sub("", text)):
        if span.startswith(("kubectl ", "helm ")):
            found.append(span)
    return found


def _words(command: str) -> list[str]:
    # Up to a pipe or a here-document: what follows is another program's.
    head = re.split(r"\s\|\s|<<", command)[0]
    return shlex.split(head, comments=True)


def named_objects(command: str) -> list[tuple[str, str]]:
    """(kind, name) of each object the command names."""
    named = [(_KINDS[k], n) for k, n in _SLASHED.findall(command)]
    # `kubectl get secret NAME`, `kubectl create secret generic NAME`: the words left once the
    # flags (and the values of those that take the next word) are dropped.
    words, skip = [], False
    for word in _words(command):
        if skip or word.startswith("-"):
            skip = not skip and word in _FLAGS_WITH_VALUES
            continue
        words.append(word)
    if "secret" in words:
        rest = words[words.index("secret") + 1 :]
        rest = rest[1:] if rest[:1] == ["generic"] else rest
        if rest:
            named.append(("Secret", rest[0]))
    return named


def _flag_values(command: str, *flags: str) -> list[str]:
    words = _words(command)
    values = []
    for i, word in enumerate(words):
        for flag in flags:
            if word == flag and i + 1 < len(words):
                values.append(words[i + 1])
            elif word.startswith(f"{flag}="):
                values.append(word.split("=", 1)[1])
    return values


def quickstart_install() -> str:
    (install,) = [c for c in commands("quickstart.md") if c.startswith("helm install ")]
    return install


def _render(tools: Tools, set_values: dict[str, str]) -> list[dict[str, Any]]:
    return tools.template(release=RELEASE, namespace=NAMESPACE, set_values=set_values)


@pytest.fixture(scope="module")
def rendered(tools: Tools) -> dict[str, set[str]]:
    """Names per kind in the chart rendered with the quickstart's values and with the defaults;
    the Secret the api-token hook Job creates counts as a Secret."""
    install = quickstart_install()
    values = dict(v.split("=", 1) for v in _flag_values(install, "--set"))
    names: dict[str, set[str]] = {}
    for objects in (_render(tools, values), _render(tools, {"database.url": "postgresql://x"})):
        for obj in objects:
            names.setdefault(obj["kind"], set()).add(obj["metadata"]["name"])
            for container in _containers(obj):
                for arg in container.get("args") or []:
                    if str(arg).startswith("--secret="):
                        names.setdefault("Secret", set()).add(str(arg).split("=", 1)[1])
    # The Secret the quickstart itself creates and hands to the chart as existingSecret.
    names["Secret"].add(values["existingSecret"])
    return names


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    return list(spec.get("containers") or [])


@pytest.mark.parametrize("page", PAGES)
def test_every_object_a_command_names_is_one_the_chart_makes(
    page: str, rendered: dict[str, set[str]]
) -> None:
    checked = 0
    for command in commands(page):
        assert "<release>" not in command, f"{page}: a placeholder in {command!r}"
        for kind, name in named_objects(command):
            assert name in rendered.get(kind, set()), (
                f"{page}: {command!r} names {kind} {name}, which release {RELEASE} does not have "
                f"(it has {sorted(rendered.get(kind, set()))})"
            )
            checked += 1
        for namespace in _flag_values(command, "-n", "--namespace"):
            assert namespace == NAMESPACE, f"{page}: {command!r}"
        for selector in _flag_values(command, "-l", "--selector"):
            assert selector == f"app.kubernetes.io/instance={RELEASE}", f"{page}: {command!r}"
        for path in _flag_values(command, "-f"):
            if path.startswith(("charts/", "examples/", "crds/")):
                assert (ROOT / path).exists(), f"{page}: {command!r}: no {path}"
        if command.startswith("helm "):
            words = _words(command)
            if words[1:2] in (["install"], ["upgrade"], ["rollback"]) and len(words) > 2:
                assert words[2] == RELEASE, f"{page}: {command!r}"
    if page != "quickstart.md":
        assert checked, f"{page} names no object: the extraction is broken"


def test_the_quickstart_builds_the_image_the_chart_runs(tools: Tools) -> None:
    text = (ROOT / "docs" / "quickstart.md").read_text()
    (version_line,) = [ln for ln in text.splitlines() if ln.startswith("VERSION=")]
    version = subprocess.run(
        ["bash", "-c", f'{version_line}\necho "$VERSION"'],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert version == app_version
    install = quickstart_install()
    values = dict(v.split("=", 1) for v in _flag_values(install, "--set"))
    pushed = [ln for ln in text.splitlines() if ln.startswith("docker push ")]
    assert pushed == [f'docker push "{values["image.repository"]}:$VERSION"']
    images = {
        c["image"]
        for obj in _render(tools, values)
        for c in _containers(obj)
        if obj["kind"] in ("Deployment", "Job")
    }
    assert images == {f"{values['image.repository']}:{app_version}"}


def test_the_extraction_finds_what_the_pages_name() -> None:
    # A negative control for the parser: names in each shape the pages use.
    assert named_objects("kubectl logs -n notify-queue job/notify-queue-migrate") == [
        ("Job", "notify-queue-migrate")
    ]
    assert named_objects(
        "kubectl get secret -n notify-queue notify-queue-api-token -o jsonpath='{.data.api-token}'"
        " | base64 -d"
    ) == [("Secret", "notify-queue-api-token")]
    assert named_objects(
        "kubectl create secret generic -n notify-queue notify-queue-api-token"
        ' --from-literal=a="$(openssl rand -hex 24)" --dry-run=client -o yaml'
    ) == [("Secret", "notify-queue-api-token")]
    assert named_objects("kubectl exec -n notify-queue deploy/notify-queue-operator -- x") == [
        ("Deployment", "notify-queue-operator")
    ]
