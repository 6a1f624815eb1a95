"""Traces end to end: one trace per notification, across the API and worker processes.

The API and a worker run as real processes exporting OTLP/HTTP to a receiver this test runs
(decoded with opentelemetry-proto); a test HTTP provider and a webhook receiver record the
`traceparent` they are sent. The create's trace id must reach both, and the worker's spans must
continue the stored context. Tracing off (no OTEL_* exporter) must not load the SDK at all.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from notify_queue.errors import ConfigurationError
from notify_queue.tracing import exporters_from_environment
from tests.receivers import WebhookReceiver
from tests.support import eventually, free_port


@dataclass(frozen=True)
class ExportedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    links: tuple[str, ...]  # trace ids


@dataclass
class OtlpReceiver:
    """An OTLP/HTTP trace receiver (`POST /v1/traces`, protobuf) that keeps every span."""

    spans: list[ExportedSpan] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> OtlpReceiver:
        app = web.Application()
        app.router.add_post("/v1/traces", self._export)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def _export(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        export = ExportTraceServiceRequest.FromString(body)
        for resource_spans in export.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    self.spans.append(
                        ExportedSpan(
                            service=str(resource.get("service.name")),
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            links=tuple(link.trace_id.hex() for link in s.links),
                        )
                    )
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    def named(self, name: str, trace_id: str) -> list[ExportedSpan]:
        return [s for s in self.spans if s.name == name and s.trace_id == trace_id]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def _traced_environment(endpoint: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("NOTIFY_QUEUE_") and not k.startswith("OTEL_")
    }
    # Standard variables only; a short batch delay so spans arrive while the test waits.
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_BSP_SCHEDULE_DELAY="100")
    return env


@asynccontextmanager
async def _process(command: list[str], env: dict[str, str], log_path: Path) -> AsyncIterator[None]:
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _trace_id(traceparent: str) -> str:
    version, trace_id, span_id, _flags = traceparent.split("-")
    assert (version, len(trace_id), len(span_id)) == ("00", 32, 16), traceparent
    return trace_id


@pytest.fixture
async def peers() -> AsyncIterator[tuple[OtlpReceiver, WebhookReceiver, WebhookReceiver]]:
    collector, provider, hooks = OtlpReceiver(), WebhookReceiver(), WebhookReceiver()
    await collector.start()
    await provider.start()  # records every POST and answers 204: an HTTP provider that sends
    await hooks.start()
    try:
        yield collector, provider, hooks
    finally:
        for peer in (collector, provider, hooks):
            await peer.stop()


async def test_one_trace_runs_from_the_create_to_the_provider_and_the_webhook_receiver(
    database_url: str,
    tmp_path: Path,
    peers: tuple[OtlpReceiver, WebhookReceiver, WebhookReceiver],
) -> None:
    collector, provider, hooks = peers
    env = _traced_environment(collector.url)
    port = free_port()
    api = [sys.executable, "-m", "notify_queue", "api", "--port", str(port)]
    api += ["--database-url", database_url, "--log-level", "WARNING"]
    worker = [sys.executable, "-m", "notify_queue", "worker", "--database-url", database_url]
    worker += ["--provider", "http", "--provider-url", provider.url, "--webhook-url", hooks.url]
    worker += ["--log-level", "WARNING"]
    base_url = f"http://127.0.0.1:{port}"
    async with (
        _process(api, env, tmp_path / "api.log"),
        _process(worker, env, tmp_path / "worker.log"),
        httpx.AsyncClient(base_url=base_url) as http,
    ):

        async def ready() -> bool:
            try:
                return (await http.get("/readyz")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(ready, timeout=60, what="the API answering /readyz")
        body = {"channel": "email", "recipient": "a@example.com", "body": "hello"}
        # One create starts its own trace; the other continues its client's trace.
        first = await http.post("/notifications", json=body, headers={"Idempotency-Key": "t-1"})
        client_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
        second = await http.post(
            "/notifications",
            json=body,
            headers={
                "Idempotency-Key": "t-2",
                "traceparent": f"00-{client_trace}-00f067aa0ba902b7-01",
            },
        )
        assert (first.status_code, second.status_code) == (201, 201), first.text
        ids = [first.json()["id"], second.json()["id"]]

        async def webhooks_arrived() -> bool:
            return len(hooks.received) >= 2

        await eventually(webhooks_arrived, timeout=60, what="both webhook events")

        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            cursor = await conn.execute(
                "SELECT id::text, traceparent FROM nq_all_notifications WHERE id = ANY(%s::uuid[])",
                (ids,),
            )
            stored: dict[str, str] = dict(await cursor.fetchall())
        traces = {id: _trace_id(stored[id]) for id in ids}
        assert traces[ids[1]] == client_trace
        assert traces[ids[0]] != client_trace

        sent = {r.json["id"]: _trace_id(r.headers["traceparent"]) for r in provider.received}
        assert sent == traces  # the provider's request carries the notification's trace
        relayed = {r.json["jobId"]: _trace_id(r.headers["traceparent"]) for r in hooks.received}
        assert relayed == traces  # and so does the webhook POST

        wanted = ("notify_queue.deliver", "notify_queue.provider.call")
        wanted += ("notify_queue.completion", "notify_queue.webhook.relay")

        async def spans_exported() -> bool:
            return all(collector.named(n, t) for n in wanted for t in traces.values())

        await eventually(spans_exported, timeout=60, what="the worker's spans at the receiver")
        for id, trace in traces.items():
            (deliver,) = collector.named("notify_queue.deliver", trace)
            # The delivery's parent is the span whose context the create stored.
            assert deliver.parent_span_id == stored[id].split("-")[2]
            assert deliver.service == "notify-queue-worker"
            assert deliver.attributes["notify_queue.notification.id"] == id
            assert deliver.attributes["notify_queue.channel"] == "email"
            assert deliver.attributes["notify_queue.attempt"] == 1
            assert deliver.attributes["notify_queue.outcome"] == "sent"
            assert deliver.attributes["notify_queue.provider"] == "http"
            (call,) = collector.named("notify_queue.provider.call", trace)
            assert call.parent_span_id == deliver.span_id
            assert call.attributes["notify_queue.provider"] == "http"
            # aiohttp's instrumentation: the HTTP request under the call, whose context is the
            # `traceparent` the provider received.
            http_spans = [s for s in collector.spans if s.parent_span_id == call.span_id]
            assert len(http_spans) == 1
            (received,) = [r for r in provider.received if r.json["id"] == id]
            assert received.headers["traceparent"].split("-")[2] == http_spans[0].span_id
            (completion,) = collector.named("notify_queue.completion", trace)
            assert completion.parent_span_id == deliver.span_id
            assert completion.attributes["notify_queue.status"] == "SENT"
            (relay,) = collector.named("notify_queue.webhook.relay", trace)
            assert relay.attributes["notify_queue.outcome"] == "delivered"
            (hook,) = [r for r in hooks.received if r.json["jobId"] == id]
            assert hook.headers["traceparent"].split("-")[2] == relay.span_id

        # The API's side: its server span for the create is the stored context (FastAPI's
        # instrumentation), and the client's trace was continued, not replaced.
        async def api_spans_exported() -> bool:
            return all(
                any(s.span_id == stored[id].split("-")[2] for s in collector.spans) for id in ids
            )

        await eventually(api_spans_exported, timeout=60, what="the API's spans")
        for id in ids:
            (created,) = [s for s in collector.spans if s.span_id == stored[id].split("-")[2]]
            assert created.service == "notify-queue-api"
            assert created.trace_id == traces[id]
        (continued,) = [
            s
            for s in collector.spans
            if s.span_id == stored[ids[1]].split("-")[2] and s.trace_id == client_trace
        ]
        assert continued.parent_span_id == "00f067aa0ba902b7"
        # psycopg's instrumentation: the worker's statements are spans too.
        assert any(s.attributes.get("db.system") == "postgresql" for s in collector.spans)

        # A digest joins many traces in one delivery: each item keeps its own trace, and the
        # carrier's delivery span (in its own trace) links to the others'.
        item_traces = ["5bf92f3577b34da6a3ce929d0e0e4737", "6bf92f3577b34da6a3ce929d0e0e4738"]
        digest = {"key": "likes", "windowSeconds": 1}
        for n, trace in enumerate(item_traces):
            joined = await http.post(
                "/notifications",
                json={**body, "recipient": "d@example.com", "digest": digest},
                headers={
                    "Idempotency-Key": f"d-{n}",
                    "traceparent": f"00-{trace}-00f067aa0ba902b{n}-01",
                },
            )
            assert joined.status_code == 201, joined.text

        async def digest_delivered() -> list[ExportedSpan]:
            return [
                s
                for t in item_traces
                for s in collector.named("notify_queue.deliver", t)
                if s.attributes.get("notify_queue.outcome") == "sent"
            ]

        (carrier,) = await eventually(digest_delivered, timeout=60, what="the digest's delivery")
        assert {carrier.trace_id, *carrier.links} >= set(item_traces)


def test_a_process_without_an_exporter_never_loads_the_sdk() -> None:
    code = (
        "import sys; from notify_queue import tracing; from notify_queue.api.app import "
        "create_app; from notify_queue.worker import runner; "
        "assert not tracing.configure('worker'); assert tracing.current_traceparent() is None; "
        "assert not [m for m in sys.modules if m.startswith('opentelemetry.sdk')], 'sdk loaded'; "
        "assert not [m for m in sys.modules if m.startswith('opentelemetry.instrumentation')]"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


@pytest.mark.parametrize(
    ("environ", "exporters"),
    [
        ({}, []),
        ({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "console,otlp"}, ["console", "otlp"]),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, []),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, []),
    ],
)
def test_tracing_is_on_only_when_the_environment_names_an_exporter(
    environ: dict[str, str], exporters: list[str]
) -> None:
    assert exporters_from_environment(environ) == exporters


def test_an_exporter_this_build_lacks_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="zipkin"):
        exporters_from_environment({"OTEL_TRACES_EXPORTER": "zipkin"})


def test_the_cli_refuses_an_unsupported_otlp_protocol_in_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NOTIFY_QUEUE_"))}
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:1", OTEL_EXPORTER_OTLP_PROTOCOL="grpc")
    done = subprocess.run(
        [sys.executable, "-m", "notify_queue", "worker", "--database-url", "postgresql://x/y"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "grpc is not supported" in done.stderr


def test_a_malformed_stored_traceparent_starts_a_new_trace_instead_of_failing() -> None:
    # Rows may carry a context written by someone else (a caller of the SQL function, later).
    code = """
from notify_queue import tracing
assert tracing.configure("worker")
good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
for bad in ["", "garbage", "00-xyz-00f067aa0ba902b7-01", "00-" + "0" * 32 + "-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"]:
    assert tracing.link_to(bad) is None, bad
    with tracing.span("x", parent=bad, root=True) as span:
        assert span is not None and span.parent is None, bad
        assert tracing.traceparent_of(span) != bad
with tracing.span("x", parent=good, links=[tracing.link_to(good)]) as span:
    assert span is not None and span.parent is not None
    assert tracing.traceparent_of(span).split("-")[1] == good.split("-")[1]
    assert tracing.current_traceparent() == tracing.traceparent_of(span)
    headers = tracing.propagation_headers(tracing.traceparent_of(span))
    assert headers["traceparent"] == tracing.traceparent_of(span), headers
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(OTEL_TRACES_EXPORTER="console", OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="psycopg")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, stdout=subprocess.DEVNULL)
