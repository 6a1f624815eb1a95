"""The HTTP API's application factory: routes, problem handlers, body limit, and the lifespan
that wires a database pool to the notification service.

`create_app` builds a complete ASGI application from settings; its lifespan opens the database
pool (unless one is passed in, as `notify-queue up` and the tests do) without waiting for
PostgreSQL, so the API starts while the database is away and answers 503 (`/readyz` included)
until it is back, each call bounded by the `database_timeout` setting. New work pokes the
workers through a debounced NOTIFY, closed with the app. Each app has its own state (the metrics
registry too), so one process can hold several apps, and several processes share one database.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from notify_queue import __version__, heap, tracing
from notify_queue.api.auth import Auth
from notify_queue.api.limits import BodyLimits
from notify_queue.api.metrics import QueueMetrics, SnapshotCache
from notify_queue.api.openapi import build_openapi
from notify_queue.api.problems import install_problem_handlers
from notify_queue.api.routes_escalations import add_escalation_routes
from notify_queue.api.routes_notifications import add_notification_routes
from notify_queue.api.routes_ops import add_ops_routes
from notify_queue.api.routes_receipts import add_receipt_routes
from notify_queue.api.routes_recipients import add_recipient_routes
from notify_queue.api.routes_unsubscribe import add_unsubscribe_routes
from notify_queue.api.runtime import ApiRuntime
from notify_queue.providers.receipts import ReceiptVerifier, verifier_for
from notify_queue.providers.specs import load_provider_specs
from notify_queue.repositories import schema
from notify_queue.repositories.db import Database
from notify_queue.repositories.escalations import EscalationRepository
from notify_queue.repositories.notifications import NotificationRepository
from notify_queue.repositories.receipts import ReceiptRepository
from notify_queue.repositories.recipients import RecipientRepository
from notify_queue.services.escalations import EscalationService
from notify_queue.services.notifications import CREATES_IN_FLIGHT, NotificationService
from notify_queue.services.receipts import ReceiptService
from notify_queue.services.recipients import RecipientService
from notify_queue.services.rendering import RenderPool
from notify_queue.services.wakeups import DebouncedWaker
from notify_queue.settings import ApiSettings

log = logging.getLogger(__name__)

DESCRIPTION = """\
A notification queue (email, SMS, push) on PostgreSQL. Enqueue notifications idempotently,
read and list them, cancel and retry them, and watch the queue. Errors are RFC 9457
`application/problem+json`; times are RFC 3339 UTC.
"""


def create_app(settings: ApiSettings, *, db: Database | None = None) -> FastAPI:
    """The API as an ASGI app. With `db`, the caller owns that pool; else the app opens its own."""
    auth = Auth(api_token=settings.api_token, admin_token=settings.admin_token)
    metrics = QueueMetrics()
    # Read here, not in the lifespan: a bad key or certificate stops `api` with one line.
    receipt_verifiers = receipt_verifiers_of(settings)
    metrics.watch_receipts(receipt_verifiers)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        database = db if db is not None else open_database(settings)
        if db is None:
            await database.open(wait=False)
        metrics.watch_pool(database.pool_stats)
        repository = NotificationRepository(database, default_webhook_url=settings.webhook_url)
        waker = DebouncedWaker(repository.workers_wake)
        # Templates render in worker processes, never on this event loop (services.rendering).
        renderer = RenderPool()
        service = NotificationService(
            repository,
            default_max_attempts=settings.max_attempts,
            waker=waker,
            # Half the pool at most: coalesced creates never starve reads of connections.
            creates_in_flight=max(1, min(CREATES_IN_FLIGHT, settings.database_pool_size // 2)),
            renderer=renderer,
        )
        app.state.runtime = ApiRuntime(
            service=service,
            metrics=metrics,
            metrics_status=SnapshotCache(
                functools.partial(service.status, waiting=True),
                max_age_seconds=settings.metrics_refresh_seconds,
            ),
            schema_version=functools.partial(schema.current_version, database),
            missing_schema_steps=functools.partial(schema.missing_steps, database),
            recipients=RecipientService(
                RecipientRepository(database), default_region=settings.default_region
            ),
            escalations=EscalationService(
                EscalationRepository(database, default_webhook_url=settings.webhook_url),
                default_max_attempts=settings.max_attempts,
                waker=waker,
                renderer=renderer,
            ),
            default_region=settings.default_region,
            receipts=ReceiptService(
                ReceiptRepository(database, default_webhook_url=settings.webhook_url),
                # Like creates: half the pool at most, so reads are never starved.
                max_in_flight=max(1, min(CREATES_IN_FLIGHT, settings.database_pool_size // 2)),
            ),
            receipt_verifiers=receipt_verifiers,
        )
        heap.settle()
        try:
            yield
        finally:
            await waker.close()
            await renderer.close()
            if db is None:
                await database.close()

    app = FastAPI(
        title="Notify Queue",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        openapi_url="/openapi.json",
        docs_url=None,
        redoc_url=None,
        # FastAPI's OpenTelemetry hooks: this program exports no traces or metrics that way
        # (its metrics are /metrics), and asking whether a provider is configured cost a few
        # per cent of every request.
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
    )
    install_problem_handlers(app)
    # Added to the app's own router (not included from another), so routing, 405 and the
    # OpenAPI document all see one flat list of routes.
    add_notification_routes(app.router, auth)
    add_recipient_routes(app.router, auth)
    add_escalation_routes(app.router, auth)
    add_receipt_routes(app.router, auth)
    add_unsubscribe_routes(
        app.router,
        tuple(s for s in (settings.unsubscribe_secret, settings.unsubscribe_previous_secret) if s),
    )
    add_ops_routes(app.router, auth)
    app.add_middleware(
        BodyLimits,
        max_body_bytes=settings.max_body_bytes,
        body_timeout_seconds=settings.body_timeout_seconds,
    )
    app.openapi = functools.partial(build_openapi, app)  # type: ignore[method-assign]
    # Server spans, continuing a traced client's `traceparent`; the creates store their span's
    # context (services.validation). Nothing when tracing is off.
    tracing.instrument_app(app)
    return app


def receipt_verifiers_of(settings: ApiSettings) -> dict[str, ReceiptVerifier]:
    """The verifier of each provider in --providers-file that takes receipts (none without)."""
    if settings.providers_file is None:
        return {}
    specs = load_provider_specs(settings.providers_file)
    verifiers = {
        spec.name: verifier_for(spec, public_url=settings.public_url) for spec in specs.providers
    }
    return {name: v for name, v in verifiers.items() if v is not None}


def open_database(settings: ApiSettings) -> Database:
    """The API's pool; named per process so `pg_stat_activity` shows which process holds what."""
    return Database(
        settings.require_database_url(),
        pool_size=settings.database_pool_size,
        name=f"notify-queue-api-{os.getpid()}",
        acquire_timeout_seconds=settings.database_timeout,
        prepared_statements=settings.prepares_on_server,
    )
