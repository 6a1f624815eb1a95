"""OpenTelemetry traces: one trace per notification, from its create to its webhook.

Configured only by the standard `OTEL_*` environment variables, and off unless they name an
exporter: `OTEL_TRACES_EXPORTER` (`otlp` or `console`; `none` is off), or an OTLP endpoint
(`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`). `OTEL_SDK_DISABLED=true`
wins over both. Unlike the SDK's own auto-configuration, an unset `OTEL_TRACES_EXPORTER` does not
mean "OTLP to localhost:4318": nobody listens there in most installations, and a process must not
pay for spans nobody receives.

Off, nothing of the SDK is imported and every helper here is a check of one module global: a
span is the shared `nullcontext`, a traceparent is None. On, the SDK is imported once, at start
(`configure`): a `TracerProvider` with the environment's resource and sampler
(`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER[_ARG]`), a batch span
processor (`OTEL_BSP_*`) and the OTLP/HTTP protobuf exporter (`OTEL_EXPORTER_OTLP_*`); the
instrumentations of psycopg (one span per statement), aiohttp's client (the HTTP provider's
calls, carrying `traceparent`) and, per app, FastAPI (`instrument_app`).

The context a notification carries is its W3C `traceparent`, stored with its row at the create
(the API request's span, the operator's mirror span): workers are other processes, often much
later, so the context travels through the database, not through memory.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from notify_queue import __version__
from notify_queue.errors import ConfigurationError

if TYPE_CHECKING:  # the SDK is imported only when tracing is on (configure)
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger(__name__)

# Attribute names people filter on (docs/operations.md "Traces").
NOTIFICATION_ID = "notify_queue.notification.id"
CHANNEL = "notify_queue.channel"
PROVIDER = "notify_queue.provider"
OUTCOME = "notify_queue.outcome"
ATTEMPT = "notify_queue.attempt"
PRIORITY = "notify_queue.priority"
STATUS = "notify_queue.status"
BATCH_SIZE = "notify_queue.batch.size"
WEBHOOK_EVENT_ID = "notify_queue.webhook.event_id"

# The OTEL_* variables the program reads (through the SDK, its OTLP/HTTP exporter and the
# FastAPI instrumentation), and what each does: the chart's `tracing.env` accepts exactly these
# (scripts/gen-chart-schema.py), docs/operations.md "Traces" explains them.
VARIABLES: dict[str, str] = {
    "OTEL_SDK_DISABLED": "true: tracing off whatever else is set.",
    "OTEL_TRACES_EXPORTER": "otlp, console or none (comma-separated). Unset: otlp when an OTLP "
    "endpoint is set, else off.",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "The collector's OTLP/HTTP base URL (http://collector:4318); "
    "setting it turns tracing on.",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "The full traces URL (http://collector:4318/v1/traces), "
    "instead of the base URL; setting it turns tracing on.",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf, the only protocol this build exports.",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf, for traces only.",
    "OTEL_EXPORTER_OTLP_HEADERS": "Headers of every export (key=value,...); a token belongs in a "
    "role's extraEnv from a Secret.",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "Headers of trace exports only.",
    "OTEL_EXPORTER_OTLP_TIMEOUT": "Milliseconds an export may take [10000].",
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "Milliseconds a trace export may take.",
    "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip or none [none].",
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip or none, for traces only.",
    "OTEL_EXPORTER_OTLP_CERTIFICATE": "A CA bundle file to verify the collector's TLS with.",
    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": "The same, for traces only.",
    "OTEL_SERVICE_NAME": "The service name [notify-queue-<role>: -api, -worker, -operator].",
    "OTEL_RESOURCE_ATTRIBUTES": "More resource attributes (key=value,...), such as "
    "deployment.environment.name=prod.",
    "OTEL_TRACES_SAMPLER": "always_on, always_off, traceidratio, parentbased_always_on [default], "
    "parentbased_always_off or parentbased_traceidratio.",
    "OTEL_TRACES_SAMPLER_ARG": "The ratio of the traceidratio samplers (0.1: one trace in ten).",
    "OTEL_PROPAGATORS": "How context travels in HTTP headers [tracecontext,baggage]; the "
    "stored context is always W3C traceparent.",
    "OTEL_BSP_SCHEDULE_DELAY": "Milliseconds between exports [5000].",
    "OTEL_BSP_MAX_QUEUE_SIZE": "Spans buffered before new ones are dropped [2048].",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "Spans per export [512].",
    "OTEL_BSP_EXPORT_TIMEOUT": "Milliseconds an export of a batch may take [30000].",
    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "Attributes kept per span [128].",
    "OTEL_SPAN_LINK_COUNT_LIMIT": "Links kept per span [128].",
    "OTEL_PYTHON_FASTAPI_EXCLUDED_URLS": "API paths that make no span [healthz,readyz,metrics].",
    "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "Instrumentations to leave out: psycopg (a span "
    "per statement), aiohttp-client (the HTTP provider's request spans; the provider still gets "
    "traceparent), fastapi (the API's request spans).",
}

# Paths whose requests make no span: probes and scrapes arrive every few seconds and say nothing
# about a notification. OTEL_PYTHON_FASTAPI_EXCLUDED_URLS replaces this list.
_EXCLUDED_URLS = "healthz,readyz,metrics"
_EXPORTERS = ("otlp", "console")

_tracer: Tracer | None = None
_aiohttp_instrumented = False


class _Sdk:
    """What the hot paths use of OpenTelemetry, looked up once when tracing is turned on (an
    import statement in a function costs a lookup on every call)."""

    def __init__(self) -> None:
        from opentelemetry.context import Context
        from opentelemetry.trace import (
            Link,
            NonRecordingSpan,
            SpanContext,
            SpanKind,
            TraceFlags,
            get_current_span,
            set_span_in_context,
        )

        self.Context = Context
        self.Link = Link
        self.NonRecordingSpan = NonRecordingSpan
        self.SpanContext = SpanContext
        self.TraceFlags = TraceFlags
        self.get_current_span = get_current_span
        self.set_span_in_context = set_span_in_context
        self.kinds = {k.name.lower(): k for k in SpanKind}


_sdk: Any = None  # an _Sdk once tracing is on
_NOTHING: contextlib.nullcontext[None] = contextlib.nullcontext()


def exporters_from_environment(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The exporters the environment asks for; empty: tracing is off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    named = environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if named:
        chosen = [n.strip().lower() for n in named.split(",") if n.strip()]
        unknown = [n for n in chosen if n not in (*_EXPORTERS, "none")]
        if unknown:
            raise ConfigurationError(
                [
                    f"OTEL_TRACES_EXPORTER={named}: {', '.join(unknown)} is not an exporter this "
                    f"build has (otlp, console or none)"
                ]
            )
        return [n for n in chosen if n != "none"]
    if environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    ):
        return ["otlp"]
    return []


def enabled() -> bool:
    return _tracer is not None


def recording() -> bool:
    """Whether the span running now records (on, and its trace sampled): spans under one that
    does not would not be recorded either, so callers skip making them."""
    return _tracer is not None and bool(_sdk.get_current_span().is_recording())


def configure(role: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Turn tracing on for this process when the environment names an exporter; True if on.
    Call once, before any database pool or HTTP session is made (the instrumentations patch
    their constructors)."""
    global _tracer, _aiohttp_instrumented, _sdk
    exporters = exporters_from_environment(environ)
    if not exporters or _tracer is not None:
        return _tracer is not None
    protocol = environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    ).strip()
    if "otlp" in exporters and protocol not in ("", "http/protobuf"):
        raise ConfigurationError(
            [f"OTLP protocol {protocol} is not supported: use http/protobuf (port 4318)"]
        )
    from opentelemetry import trace
    from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
    )

    attributes: dict[str, Any] = {SERVICE_VERSION: __version__, "notify_queue.role": role}
    named = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    if not named:
        attributes[SERVICE_NAME] = f"notify-queue-{role}"
    provider = TracerProvider(resource=Resource.create(attributes))
    for name in exporters:
        exporter: SpanExporter
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        else:
            exporter = ConsoleSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    if _instrumented("psycopg", environ):
        PsycopgInstrumentor().instrument(tracer_provider=provider)
    if _instrumented("aiohttp-client", environ):
        AioHttpClientInstrumentor().instrument(tracer_provider=provider)
        _aiohttp_instrumented = True
    _sdk = _Sdk()
    _tracer = provider.get_tracer("notify_queue", __version__)
    log.info(
        "tracing on: %s, service %s",
        ", ".join(exporters),
        provider.resource.attributes.get(SERVICE_NAME),
    )
    return True


def _instrumented(name: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether an instrumentation is wanted: OTEL_PYTHON_DISABLED_INSTRUMENTATIONS (the
    variable opentelemetry-instrument reads) lists those that are not."""
    disabled = environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "")
    return name not in {d.strip() for d in disabled.split(",")}


def shutdown() -> None:
    """Export what is buffered (the SDK also does this at exit)."""
    if _tracer is None:
        return
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    flush = getattr(provider, "force_flush", None)
    if flush is not None:
        flush()


def instrument_app(app: Any) -> None:
    """FastAPI's server spans (and the incoming `traceparent` of a traced client) for one app."""
    if _tracer is None or not _instrumented("fastapi"):
        return
    from opentelemetry import trace
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    excluded = os.environ.get("OTEL_PYTHON_FASTAPI_EXCLUDED_URLS", _EXCLUDED_URLS)
    FastAPIInstrumentor.instrument_app(
        app, tracer_provider=trace.get_tracer_provider(), excluded_urls=excluded
    )


def current_traceparent() -> str | None:
    """The W3C `traceparent` of the span running now; None when off or outside any span."""
    if _tracer is None:
        return None
    context = _sdk.get_current_span().get_span_context()
    return _format(context) if context.is_valid else None


def traceparent_of(span: Span | None) -> str | None:
    if span is None:
        return None
    context = span.get_span_context()
    return _format(context) if context.is_valid else None


def _format(context: Any) -> str:
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def _span_context(traceparent: str) -> Any:
    """The span context a W3C `traceparent` names; None when it is not one. Parsed here rather
    than by the propagator (a regular expression and two context copies): it runs per delivery,
    and a stored traceparent is one this program wrote."""
    parts = traceparent.split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or len(parts[2]) != 16 or len(parts[3]) < 2:
        return None
    try:
        trace_id, span_id = int(parts[1], 16), int(parts[2], 16)
        flags = int(parts[3][:2], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return _sdk.SpanContext(trace_id, span_id, True, _sdk.TraceFlags(flags))


def _context_of(traceparent: str | None) -> Any:
    """An OpenTelemetry context whose parent is the stored `traceparent`; without one (or an
    invalid one), an empty context: a new trace, not a child of whatever runs now."""
    parent = _span_context(traceparent) if traceparent else None
    if parent is None:
        return _sdk.Context()
    return _sdk.set_span_in_context(_sdk.NonRecordingSpan(parent), _sdk.Context())


def link_to(traceparent: str | None) -> Any:
    """A link to the span `traceparent` names (None when off or without one); build it once and
    pass it to every span that links there."""
    if _tracer is None or not traceparent:
        return None
    parent = _span_context(traceparent)
    return None if parent is None else _sdk.Link(parent)


def span(
    name: str,
    *,
    attributes: Mapping[str, Any] | None = None,
    parent: str | None = None,
    root: bool = False,
    kind: str = "internal",
    links: Sequence[Any] = (),
    start_time_ns: int | None = None,
) -> contextlib.AbstractContextManager[Span | None]:
    """A span as a context manager yielding it (None when off: callers check before setting
    attributes). `parent` is a stored traceparent; `root` starts a new trace instead of a child
    of the current span; `links` are traceparents this span relates to."""
    if _tracer is None:
        return _NOTHING
    return _span(name, attributes, parent, root, kind, links, start_time_ns)


@contextlib.contextmanager
def _span(
    name: str,
    attributes: Mapping[str, Any] | None,
    parent: str | None,
    root: bool,
    kind: str,
    links: Sequence[Any],
    start_time_ns: int | None,
) -> Iterator[Span | None]:
    assert _tracer is not None
    context = _context_of(parent) if parent is not None or root else None
    with _tracer.start_as_current_span(
        name,
        context=context,
        kind=_sdk.kinds[kind],
        attributes=attributes,
        links=[link_to(t) if isinstance(t, str) else t for t in links if t] or None,
        start_time=start_time_ns,
    ) as current:
        yield current


def record_span(
    name: str,
    *,
    parent: str | None,
    start_time_ns: int,
    attributes: Mapping[str, Any] | None = None,
) -> None:
    """A span that already happened (from `start_time_ns` to now), as a child of `parent`."""
    if _tracer is None:
        return
    started = _tracer.start_span(
        name, context=_context_of(parent), attributes=attributes, start_time=start_time_ns
    )
    started.end()


def aiohttp_headers() -> dict[str, str]:
    """For a request through aiohttp: the current context's headers when aiohttp's
    instrumentation does not add them itself (left out by OTEL_PYTHON_DISABLED_INSTRUMENTATIONS);
    else (and when off) none."""
    if _tracer is None or _aiohttp_instrumented:
        return {}
    return propagation_headers(current_traceparent())


def propagation_headers(traceparent: str | None) -> dict[str, str]:
    """Headers that carry `traceparent` (and the process's other propagators' fields) to a
    receiver; empty when off or without a context."""
    if _tracer is None or not traceparent:
        return {}
    from opentelemetry.propagate import inject

    headers: dict[str, str] = {}
    inject(headers, context=_context_of(traceparent))
    return headers
