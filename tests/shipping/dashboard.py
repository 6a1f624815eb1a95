"""Helpers of the dashboard tests: the dashboard's queries, the metric names they use and the
names the roles export, live API and worker processes with traffic, and a real Prometheus."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.receivers import WebhookReceiver
from tests.support import eventually, free_port, running_api

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts" / "notify-queue" / "dashboards" / "notify-queue.json"
INSTALL_PROMETHEUS = ROOT / "scripts" / "install-prometheus.sh"

# Metrics a panel may use before the code exports them, each with the work that adds it. The
# name check accepts them only while they are not exported; once they are, the entry must go
# (test_pending_metrics_are_not_exported_yet), and the Prometheus test evaluates their panels.
PENDING_METRICS: dict[str, str] = {}

# What the test substitutes for the dashboard's variables: the scrape config below labels every
# target with this namespace; Prometheus scrapes every second, so 30 s holds ~30 samples.
NAMESPACE = "nq-dashboard-test"
RATE_WINDOW = "30s"

_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
}


@dataclass(frozen=True)
class Query:
    panel: str
    ref: str
    expr: str

    def substituted(self) -> str:
        """The expression as Grafana would send it with this test's variables."""
        return (
            self.expr.replace("$__rate_interval", RATE_WINDOW)
            .replace("${namespace}", NAMESPACE)
            .replace("$namespace", NAMESPACE)
        )


def load_dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return document


def panel_queries(dashboard: dict[str, Any]) -> list[Query]:
    """Every query of every panel, rows' nested panels (collapsed rows) included."""
    queries = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            walk(panel.get("panels", []))
            for target in panel.get("targets", []):
                queries.append(Query(panel["title"], target["refId"], target["expr"]))

    walk(dashboard["panels"])
    return queries


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects.

    Strings (label values), label matchers in braces, range and subquery brackets and the label
    lists of `by`/`without`/`on`/`ignoring`/`group_*` are removed first; what remains that looks
    like an identifier, is not followed by `(` (a function or aggregation) and is not a keyword
    or a number is a metric name."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(
        r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text, flags=re.I
    )
    names = set()
    for match in re.finditer(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", text):
        word, call = match.group(1), match.group(2)
        if call or word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names


def exported_names(exposition: str) -> set[str]:
    """The sample names a Prometheus text exposition offers, from its families' types (a
    labelled metric with no series yet still declares its family)."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "summary": ("", "_count", "_sum", "_created"),
        "info": ("_info",),
    }
    names = set()
    for family in text_string_to_metric_families(exposition):
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


# --- live roles --------------------------------------------------------------------------------


PROVIDERS_FILE = """\
# sim-main and sim-backup deliver email, sms and voice; sim-push gets only the `timeout` push
# tokens, so its circuit breaker opens after two timeouts in a row, half-opens a second later, and
# so on.
# sim-main takes delivery receipts (the API's receipts panels have their series from the start).
providers:
  - {name: sim-main, type: simulated, channels: [email, sms, voice], latencyMs: 2,
     receipts: {scheme: http, secretFrom: {file: WHSEC_FILE}}}
  - {name: sim-backup, type: simulated, channels: [email, sms, voice]}
  - {name: sim-push, type: simulated, channels: [push], timeout: 200ms,
     circuitBreaker: {failures: 2, openFor: 1s}}
chains:
  email: [sim-main, sim-backup]
  sms: [sim-main, sim-backup]
"""


@dataclass
class LiveRoles:
    api_url: str
    api_target: str  # host:port Prometheus scrapes
    worker_target: str
    receiver: WebhookReceiver
    traffic: Traffic

    async def scrape(self) -> dict[str, str]:
        async with httpx.AsyncClient(timeout=30) as http:
            return {
                target: (await http.get(f"http://{target}/metrics")).text
                for target in (self.api_target, self.worker_target)
            }


@dataclass
class Traffic:
    """Creates of every kind, in rounds, until stopped: sent, failed for good (`invalid`),
    timed out (`timeout`, which opens sim-main's circuit), repeats (200), conflicts (409),
    invalid requests (400), every priority, and one scheduled an hour ahead."""

    api_url: str
    rounds: int = 0
    answers: dict[int, int] = field(default_factory=dict)
    _ids: Iterator[int] = field(default_factory=itertools.count)

    def _body(self, recipient: str, priority: str, channel: str = "email") -> dict[str, Any]:
        return {"channel": channel, "recipient": recipient, "body": "hello", "priority": priority}

    async def one_round(self, http: httpx.AsyncClient) -> None:
        n = next(self._ids)
        run = uuid.uuid4().hex[:8]
        requests: list[tuple[str, dict[str, Any]]] = []
        for priority in ("HIGH", "NORMAL", "LOW"):
            requests.append(
                (f"ok-{run}-{priority}", self._body(f"u{n}-{priority}@example.com", priority))
            )
        requests.append((f"bad-{run}", self._body(f"invalid-{n}@example.com", "NORMAL")))
        requests.append((f"slow-{run}", self._body(f"timeout-{n}", "NORMAL", "push")))
        requests.append(
            (f"later-{run}", self._body(f"later-{n}@example.com", "LOW") | {"delaySeconds": 3600})
        )
        requests.append((f"ok-{run}-HIGH", self._body(f"u{n}-HIGH@example.com", "HIGH")))  # 200
        requests.append((f"ok-{run}-LOW", self._body(f"other-{n}@example.com", "LOW")))  # 409
        requests.append((f"invalid-{run}", {"channel": "fax", "recipient": "x", "body": ""}))
        for key, body in requests:
            answer = await http.post("/notifications", json=body, headers={"Idempotency-Key": key})
            self.answers[answer.status_code] = self.answers.get(answer.status_code, 0) + 1
        self.rounds += 1

    async def run(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(base_url=self.api_url, timeout=30) as http:
            while not stop.is_set():
                await self.one_round(http)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=0.5)


@contextlib.asynccontextmanager
async def running_worker(database_url: str, log_path: Path, *args: str) -> AsyncIterator[str]:
    """`notify-queue worker --metrics-port P` as a subprocess; yields `127.0.0.1:P` once its
    /healthz answers 200, stops it with SIGTERM."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFY_QUEUE_")}
    command = [sys.executable, "-m", "notify_queue", "worker", "--metrics-port", str(port), *args]
    command += ["--database-url", database_url, "--log-level", "WARNING"]
    log = log_path.open("wb")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    target = f"127.0.0.1:{port}"

    async def healthy() -> bool:
        assert process.poll() is None, log_path.read_text()
        try:
            async with httpx.AsyncClient() as http:
                return (await http.get(f"http://{target}/healthz")).status_code == 200
        except httpx.TransportError:
            return False

    try:
        await eventually(healthy, timeout=30, what="the worker's /healthz answering 200")
        yield target
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@contextlib.asynccontextmanager
async def live_roles(database_url: str, directory: Path) -> AsyncIterator[LiveRoles]:
    """An API and a worker over `database_url`, a webhook receiver that refuses its first
    three POSTs, and traffic running in the background for as long as the context lasts."""
    receiver = await WebhookReceiver(fail_first=3).start()
    providers = directory / "providers.yaml"
    whsec = directory / "receipts-secret"
    whsec.write_text("whsec_" + base64.b64encode(b"dashboard receipts secret 32 b!!").decode())
    providers.write_text(PROVIDERS_FILE.replace("WHSEC_FILE", str(whsec)))
    stop = asyncio.Event()
    try:
        async with contextlib.AsyncExitStack() as stack:
            # Both processes start at once: each spends seconds importing on a busy machine.
            api_url, worker_target = await asyncio.gather(
                stack.enter_async_context(
                    running_api(
                        database_url,
                        directory / "api.log",
                        "--max-attempts",
                        "2",
                        "--providers-file",
                        str(providers),
                    )
                ),
                stack.enter_async_context(
                    running_worker(
                        database_url,
                        directory / "worker.log",
                        "--providers-file",
                        str(providers),
                        "--webhook-url",
                        receiver.url,
                        "--poll-interval",
                        "0.2",
                        "--backoff-base",
                        "0.1",
                        "--backoff-max",
                        "0.5",
                    )
                ),
            )
            traffic = Traffic(api_url)
            runner = asyncio.create_task(traffic.run(stop))
            try:
                yield LiveRoles(
                    api_url, api_url.removeprefix("http://"), worker_target, receiver, traffic
                )
            finally:
                stop.set()
                await runner
    finally:
        await receiver.stop()


# --- Prometheus --------------------------------------------------------------------------------


def prometheus_binary() -> str | None:
    """Debian's prometheus, installed by scripts/install-prometheus.sh (make test runs it)."""
    found = subprocess.run(
        [str(INSTALL_PROMETHEUS), "--path"], capture_output=True, text=True, check=False
    )
    return (found.stdout.strip() or None) if found.returncode == 0 else None


@contextlib.asynccontextmanager
async def running_prometheus(
    binary: str, directory: Path, targets: dict[str, str]
) -> AsyncIterator[str]:
    """Prometheus scraping `targets` (job name -> host:port) every second, each labelled with
    NAMESPACE as the chart's ServiceMonitor would; yields its base URL once it is ready."""
    port = free_port()
    config = directory / "prometheus.yml"
    jobs = [
        {
            "job_name": job,
            "static_configs": [{"targets": [target], "labels": {"namespace": NAMESPACE}}],
        }
        for job, target in targets.items()
    ]
    document = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}}
    config.write_text(json.dumps(document | {"scrape_configs": jobs}))  # JSON is YAML
    log_path = directory / "prometheus.log"
    log = log_path.open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={directory / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base_url = f"http://127.0.0.1:{port}"

    async def ready() -> bool:
        assert process.poll() is None, log_path.read_text()
        try:
            async with httpx.AsyncClient() as http:
                return (await http.get(f"{base_url}/-/ready")).status_code == 200
        except httpx.TransportError:
            return False

    try:
        await eventually(ready, timeout=60, what="Prometheus answering /-/ready")
        yield base_url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def has_a_number(result: list[dict[str, Any]]) -> bool:
    """An instant vector with at least one sample that is a number (not NaN: a ratio or a
    quantile over a window with no events is NaN, which a panel draws as nothing)."""
    return any(not math.isnan(float(sample["value"][1])) for sample in result)
