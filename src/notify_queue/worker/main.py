"""Wiring of the worker and relay roles: settings in, running tasks out, until SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import platform
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from notify_queue import heap
from notify_queue.headers import GENERATED_HEADERS_VERIFIED
from notify_queue.providers import build_providers
from notify_queue.providers.outbound import trusted_session
from notify_queue.providers.posting import guarded_poster, trusted_poster
from notify_queue.providers.specs import served_channels, specs_from_settings
from notify_queue.providers.webhooks import WebhookSender
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery import DeliveryDefaults, DeliveryRepository
from notify_queue.repositories.delivery_log import DeliveryLogRepository
from notify_queue.repositories.providers import ProviderRepository
from notify_queue.repositories.webhooks import WebhookRepository
from notify_queue.repositories.workers import WorkerRepository
from notify_queue.services.delivery import DeliveryService
from notify_queue.services.rendering import RenderPool
from notify_queue.services.retention import DeliveryLogKeeper
from notify_queue.services.unsubscribe import UnsubscribeLinks
from notify_queue.services.waiting import WorkerHeartbeat
from notify_queue.settings import RelaySettings, Switch, WorkerSettings
from notify_queue.worker.dispatcher import WebhookDispatcher
from notify_queue.worker.endpoints import start_endpoints
from notify_queue.worker.metrics import DATABASE_POOL
from notify_queue.worker.routing import Router
from notify_queue.worker.runner import SAFETY_LOOK_SECONDS, Worker
from notify_queue.worker.supervision import Health, supervise

log = logging.getLogger(__name__)


def delivery_defaults(settings: WorkerSettings) -> DeliveryDefaults:
    return DeliveryDefaults(
        rate_limit=settings.rate_limit,
        rate_window_seconds=settings.rate_limit_window,
        backoff_base_seconds=settings.backoff_base,
        backoff_max_seconds=settings.backoff_max,
        lease_seconds=settings.lease_seconds,
        webhook_url=settings.webhook_url,
        aging_seconds=settings.aging_seconds,
    )


@asynccontextmanager
async def _process(
    settings: RelaySettings,
    name: str,
    db: Database | None,
    health: Health,
    *,
    session_url: str | None = None,
) -> AsyncIterator[Database]:
    """The database pool and the --metrics-port endpoints of one worker or relay process;
    `session_url` (a worker's --listen-database-url) for its LISTEN and retention lock."""
    own_db = db is None
    if db is None:
        db = Database(
            settings.require_database_url(),
            pool_size=settings.database_pool_size,
            name=name,
            session_url=session_url,
            prepared_statements=settings.prepares_on_server,
        )
        await db.open()
    endpoints = None
    DATABASE_POOL.stats = db.pool_stats
    try:
        if settings.metrics_port is not None:
            endpoints = await start_endpoints(settings.host, settings.metrics_port, health)
        yield db
    finally:
        if endpoints is not None:
            await endpoints.cleanup()
        if own_db:
            await db.close()


def webhook_dispatcher(
    settings: RelaySettings, db: Database, health: Health, *, look_seconds: float | None = None
) -> tuple[WebhookDispatcher, Callable[[], Awaitable[None]]]:
    """The outbox relay and the coroutine function that closes its HTTP clients."""
    guarded = guarded_poster(
        allow=settings.outbound_allow, timeout_seconds=settings.webhook_timeout
    )
    trusted = trusted_poster(timeout_seconds=settings.webhook_timeout)
    dispatcher = WebhookDispatcher(
        settings,
        WebhookRepository(db),
        guarded=WebhookSender(guarded, timeout_seconds=settings.webhook_timeout),
        trusted=WebhookSender(trusted, timeout_seconds=settings.webhook_timeout),
        health=health,
        look_seconds=look_seconds,
    )

    async def close() -> None:
        await guarded.close()
        await trusted.close()

    return dispatcher, close


async def run_worker(
    settings: WorkerSettings, *, db: Database | None = None, stop: asyncio.Event | None = None
) -> None:
    """Run one worker process until SIGTERM/SIGINT (or `stop`), then shut down gracefully."""
    health = Health()
    specs = specs_from_settings(settings)  # a bad providers file stops the start before any I/O
    settings = settings.model_copy(update={"channels": served_channels(settings, specs)})
    async with _process(
        settings, "notify-queue-worker", db, health, session_url=settings.listen_database_url
    ) as db:
        # Provider URLs are the operator's own endpoints: no outbound guard (docs/reliability.md).
        provider_session = trusted_session(timeout_seconds=settings.provider_timeout)
        providers = build_providers(specs, provider_session)
        router = Router(specs, providers, ProviderRepository(db), failover=settings.failover)
        dispatcher, close_dispatcher = (
            webhook_dispatcher(settings, db, health, look_seconds=SAFETY_LOOK_SECONDS)
            if settings.webhook_dispatch is Switch.ON
            else (None, None)
        )
        # Digests with a template are rendered when sent (services/digests.py), in worker
        # processes as creates are (a template is client code); none starts until one is needed.
        renderer = RenderPool()
        service = DeliveryService(
            DeliveryRepository(db, delivery_defaults(settings)),
            priorities=settings.priorities,
            channels=settings.channels,
            renderer=renderer,
            unsubscribe=UnsubscribeLinks(settings.public_url, settings.unsubscribe_secret)
            if settings.public_url and settings.unsubscribe_secret
            else None,
        )
        worker = Worker(
            service,
            router,
            dispatcher,
            concurrency=settings.concurrency,
            batch_size=settings.claim_size,
            poll_interval=settings.poll_interval,
            shutdown_grace_seconds=settings.shutdown_grace_seconds,
            health=health,
            delivery_log=DeliveryLogKeeper(
                DeliveryLogRepository(db), retention_days=settings.retention
            ),
            lease_seconds=settings.lease_seconds,
            heartbeat=WorkerHeartbeat(
                WorkerRepository(db), channels=settings.channels, priorities=settings.priorities
            ),
        )
        try:
            await router.start()
            # Said once nothing is left to await before the SIGTERM handler (_until_signal): a
            # SIGTERM after this line stops the worker gracefully.
            log.info(
                "worker started: lanes %s, channels %s, concurrency %d, batch %d, webhooks %s",
                ",".join(settings.priorities),
                ",".join(settings.channels),
                settings.concurrency,
                settings.claim_size,
                settings.webhook_dispatch,
            )
            if not GENERATED_HEADERS_VERIFIED:
                log.warning(
                    "Python %s writes email headers without checking them (CVE-2024-6923); "
                    "production needs 3.11.10, 3.12.5 or newer (docs/security.md)",
                    platform.python_version(),
                )
            await _until_signal(worker.run(), worker.stop, stop)
        finally:
            for provider in providers.values():
                await provider.close()
            await provider_session.close()
            await renderer.close()
            if close_dispatcher is not None:
                await close_dispatcher()
            log.info("worker stopped")


async def run_relay(
    settings: RelaySettings, *, db: Database | None = None, stop: asyncio.Event | None = None
) -> None:
    """Relay the webhook outbox alone until SIGTERM/SIGINT (or `stop`)."""
    health = Health()
    done = asyncio.Event()
    async with _process(
        settings, "notify-queue-relay", db, health, session_url=settings.listen_database_url
    ) as db:
        dispatcher, close_dispatcher = webhook_dispatcher(settings, db, health)
        events = WebhookRepository(db)

        async def listen() -> None:
            # Every statement that writes events NOTIFYs at its commit (docs/design.md,
            # "Wake-ups and scheduling").
            async for _ in events.webhook_events_wakeups(done):
                dispatcher.poke()

        async def relay() -> None:
            await asyncio.gather(
                supervise("webhooks", lambda: dispatcher.run(done), health, stop=done),
                supervise("listen", listen, health, stop=done),
            )

        log.info("relay started")
        try:
            await _until_signal(relay(), done.set, stop)
        finally:
            await close_dispatcher()
            log.info("relay stopped")


async def _until_signal(
    main: Awaitable[None], begin_stop: Callable[[], None], stop: asyncio.Event | None
) -> None:
    """Await `main`, calling `begin_stop` on SIGTERM/SIGINT, or when `stop` is set (inside `up`,
    the caller owns the signals)."""
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT) if stop is None else ()
    for sig in signals:
        loop.add_signal_handler(sig, begin_stop)
    stopper = asyncio.create_task(_call_when_set(stop, begin_stop)) if stop is not None else None
    heap.settle()
    try:
        await main
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        if stopper is not None:
            stopper.cancel()


async def _call_when_set(event: asyncio.Event, call: Callable[[], None]) -> None:
    await event.wait()
    call()
