"""Every example in examples/ ends where its comment says it ends.

Each example's header says what to check, as a command and its output: "Ends when
`kubectl get notif welcome -o jsonpath='{.status.phase}'` prints Sent." (and, where the object
passes through a state first, "prints Pending, and ... later prints Sent"). The test applies the
whole folder (`kubectl apply -f examples/`, as the quickstart does) into a fresh namespace of the
test cluster, with the real operator and a worker running in-process against a real PostgreSQL,
and runs those very commands until each prints what its comment promises, in order.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from notify_queue.devcluster import LocalControlPlane
from notify_queue.repositories.db import Database
from tests.operator.support import OperatorThread, running_worker, settings_for
from tests.receivers import VendorReceiver
from tests.shipping.support import ROOT, Tools, documents
from tests.support import eventually

pytestmark = pytest.mark.kubernetes

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
_CHECK = re.compile(r"`kubectl get (\S+) (\S+) -o jsonpath='([^']+)'` prints (\S+?)[.,]?(?:\s|$)")
_LATER = re.compile(r"later prints (\S+?)\.")


@dataclass(frozen=True)
class Promise:
    example: str
    resource: str
    name: str
    jsonpath: str
    outputs: tuple[str, ...]  # in the order they appear


def promise_of(path: Path) -> Promise:
    header = " ".join(
        line.removeprefix("#").strip()
        for line in path.read_text().splitlines()
        if line.startswith("#")
    )
    match = _CHECK.search(header)
    assert match, (
        f"{path.name}: no 'Ends when `kubectl get ... -o jsonpath=...` prints X.' in its header"
    )
    outputs = [match[4]] + [m[1] for m in _LATER.finditer(header[match.end() :])]
    return Promise(path.name, match[1], match[2], match[3], tuple(outputs))


def test_the_examples_are_numbered_and_each_says_where_it_ends() -> None:
    names = [p.name for p in EXAMPLES]
    assert names == [
        "01-notification.yaml",
        "02-scheduled-notification.yaml",
        "03-one-time-code.yaml",
        "04-webhook-secret.yaml",
        "05-policy.yaml",
        "06-worker-pool.yaml",
        "09-digest.yaml",
    ]
    for path in EXAMPLES:
        promise = promise_of(path)
        # One object per example, or several that end together (08: a digest's items).
        objs = documents(path.read_text())
        assert promise.name in [o["metadata"]["name"] for o in objs]
        for obj in objs:
            assert "namespace" not in obj["metadata"], f"{path.name}: in the current namespace"


async def test_every_example_ends_where_its_comment_says(
    tools: Tools, cluster: LocalControlPlane, database_url: str
) -> None:
    kubeconfig = cluster.kubeconfig
    namespace = tools.namespace(kubeconfig, prefix="examples")
    settings = settings_for(database_url, namespace)
    operator = await OperatorThread(settings, kubeconfig).start()
    try:
        async with Database(database_url, pool_size=4) as db, running_worker(settings, db):
            started = time.monotonic()
            tools.kubectl(
                "apply", "-n", namespace, "-f", str(ROOT / "examples"), kubeconfig=kubeconfig
            )
            for promise in map(promise_of, EXAMPLES):
                for expected in promise.outputs:

                    async def prints(promise: Promise = promise, expected: str = expected) -> bool:
                        result = tools.kubectl(
                            "get",
                            promise.resource,
                            promise.name,
                            "-n",
                            namespace,
                            "-o",
                            f"jsonpath={promise.jsonpath}",
                            kubeconfig=kubeconfig,
                            check=False,
                        )
                        return result.stdout.strip() == expected

                    try:
                        await eventually(prints, timeout=60, interval=0.2)
                    except AssertionError:
                        pytest.fail(
                            f"{promise.example}: {promise.jsonpath} never printed {expected!r}"
                        )
            # The scheduled one was not sent early: its delay is 20 s from creation.
            assert time.monotonic() - started >= 19
    finally:
        await operator.stop()


FLUX = ROOT / "examples" / "10-flux-deployment-failed"


async def test_the_flux_example_reaches_slack_and_pagerduty(
    tools: Tools,
    cluster: LocalControlPlane,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """examples/10-flux-deployment-failed: its providers file, with each `url` pointed at the
    local receivers, and its Notifications applied; both end Sent, as its header says, and the
    receivers got the Block Kit message and the PagerDuty trigger."""
    receiver = await VendorReceiver().start()
    config = yaml.safe_load((FLUX / "providers.yaml").read_text())
    urls = {"slack": "/slack/api", "pagerduty": "/pagerduty/v2/enqueue"}
    for provider in config["providers"]:
        provider["url"] = receiver.base + urls[provider["type"]]
    providers_file = tmp_path / "providers.yaml"
    providers_file.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("SLACK_TOKEN", "xoxb-example")
    monkeypatch.setenv("PD_PLATFORM", "R0UT1NGKEY00000000000000PLATFORM")
    kubeconfig = cluster.kubeconfig
    namespace = tools.namespace(kubeconfig, prefix="flux")
    settings = settings_for(
        database_url, namespace, providers_file=providers_file, channels=["chat", "incident"]
    )
    notifications = FLUX / "deployment-failed.yaml"
    header = " ".join(
        line.removeprefix("#").strip()
        for line in notifications.read_text().splitlines()
        if line.startswith("#")
    )
    promised = [(m[2], m[3], m[4]) for m in _CHECK.finditer(header)]
    assert {name for name, _, _ in promised} == {"podinfo-failed-page", "podinfo-failed-chat"}
    operator = await OperatorThread(settings, kubeconfig).start()
    try:
        async with Database(database_url, pool_size=4) as db, running_worker(settings, db):
            tools.kubectl("apply", "-n", namespace, "-f", str(notifications), kubeconfig=kubeconfig)
            for name, jsonpath, expected in promised:

                async def prints(
                    name: str = name, path: str = jsonpath, want: str = expected
                ) -> bool:
                    result = tools.kubectl(
                        "get", "notif", name, "-n", namespace, "-o", f"jsonpath={path}",
                        kubeconfig=kubeconfig, check=False,
                    )  # fmt: skip
                    return result.stdout.strip() == want

                await eventually(prints, timeout=60, interval=0.2, what=f"{name} {expected}")
    finally:
        await operator.stop()
        await receiver.stop()
    (chat,) = [r.json for r in receiver.of("slack")]
    assert chat["channel"] == "C0PLATFORM" and chat["text"] == "HelmRelease apps/podinfo failed"
    assert chat["blocks"][0]["text"]["text"].startswith("*HelmRelease apps/podinfo* upgrade failed")
    (page,) = [r.json for r in receiver.of("pagerduty")]
    assert page["event_action"] == "trigger" and page["routing_key"].endswith("PLATFORM")
    assert page["payload"]["summary"] == "HelmRelease apps/podinfo: upgrade failed"
    assert page["payload"]["severity"] == "critical"
