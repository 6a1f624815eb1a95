"""Wiring of the worker and relay roles: settings in, a running `Worker` (or the webhook
dispatcher alone, for `relay`) out, until SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal

from prometheus_client import start_http_server

from notify_queue.providers import build_providers
from notify_queue.providers.outbound import outbound_session
from notify_queue.providers.webhooks import WebhookSender
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery import DeliveryDefaults, DeliveryRepository
from notify_queue.repositories.webhooks import WebhookRepository
from notify_queue.services.delivery import DeliveryService
from notify_queue.settings import RelaySettings, Switch, WorkerSettings
from notify_queue.worker.dispatcher import WebhookDispatcher
from notify_queue.worker.runner import Worker

log = logging.getLogger(__name__)


def delivery_defaults(settings: WorkerSettings) -> DeliveryDefaults:
    return DeliveryDefaults(
        rate_limit=settings.rate_limit,
        rate_window_seconds=settings.rate_limit_window,
        backoff_base_seconds=settings.backoff_base,
        backoff_max_seconds=settings.backoff_max,
        lease_seconds=settings.lease_seconds,
        webhook_url=settings.webhook_url,
    )


async def run_worker(
    settings: WorkerSettings, *, db: Database | None = None, stop: asyncio.Event | None = None
) -> None:
    """Run one worker process until SIGTERM/SIGINT (or `stop`), then shut down gracefully."""
    own_db = db is None
    if db is None:
        db = Database(
            settings.require_database_url(),
            pool_size=settings.database_pool_size,
            name="notify-queue-worker",
        )
        await db.open()
    if settings.metrics_port is not None:
        start_http_server(settings.metrics_port, addr=settings.host)
    session = outbound_session(
        allow=settings.outbound_allow, timeout_seconds=settings.provider_timeout
    )
    providers = build_providers(settings, session)
    service = DeliveryService(
        DeliveryRepository(db, delivery_defaults(settings)),
        priorities=settings.priorities,
        channels=settings.channels,
    )
    dispatcher = (
        WebhookDispatcher(
            settings,
            WebhookRepository(db),
            WebhookSender(session, timeout_seconds=settings.webhook_timeout),
        )
        if settings.webhook_dispatch is Switch.ON
        else None
    )
    worker = Worker(
        service,
        providers,
        dispatcher,
        concurrency=settings.concurrency,
        batch_size=settings.batch_size,
        poll_interval=settings.poll_interval,
        shutdown_grace_seconds=settings.shutdown_grace_seconds,
    )
    # Standalone, the worker owns SIGTERM/SIGINT; inside `up`, the caller owns them and sets `stop`.
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT) if stop is None else ()
    for sig in signals:
        loop.add_signal_handler(sig, worker.stop)
    stopper = asyncio.create_task(_stop_when(stop, worker)) if stop is not None else None
    log.info(
        "worker started: lanes %s, channels %s, concurrency %d, batch %d",
        ",".join(settings.priorities),
        ",".join(settings.channels),
        settings.concurrency,
        settings.batch_size,
    )
    try:
        await worker.run()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        if stopper is not None:
            stopper.cancel()
        for provider in {id(p): p for p in providers.values()}.values():
            await provider.close()
        await session.close()
        if own_db:
            await db.close()
        log.info("worker stopped")


async def _stop_when(stop: asyncio.Event, worker: Worker) -> None:
    await stop.wait()
    worker.stop()


async def run_relay(settings: RelaySettings, *, stop: asyncio.Event | None = None) -> None:
    """Relay the webhook outbox, and nothing else, until SIGTERM/SIGINT (or `stop`)."""
    # The dispatcher is typed against the worker's settings but reads only the webhook options
    # and the poll interval, which the relay has: hand it those, the rest at their defaults.
    dispatcher_settings = WorkerSettings.model_construct(**settings.model_dump())
    # Standalone, the relay owns SIGTERM/SIGINT; a caller that passes `stop` owns them.
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT) if stop is None else ()
    stop = stop or asyncio.Event()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    db = Database(
        settings.require_database_url(),
        pool_size=settings.database_pool_size,
        name="notify-queue-relay",
    )
    session = outbound_session(
        allow=settings.outbound_allow, timeout_seconds=settings.webhook_timeout
    )
    try:
        await db.open()
        if settings.metrics_port is not None:
            start_http_server(settings.metrics_port, addr=settings.host)
        dispatcher = WebhookDispatcher(
            dispatcher_settings,
            WebhookRepository(db),
            WebhookSender(session, timeout_seconds=settings.webhook_timeout),
        )
        log.info("relay started")
        await dispatcher.run(stop)
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        await session.close()
        await db.close()
        log.info("relay stopped")
