"""An idle worker costs (almost) nothing, and still misses no work (issue 20, item 4).

An idle worker waits on LISTEN/NOTIFY and on its timers (its lanes' next due time, housekeeping's
next lease end or expiry, the relay's next event), with a safety look every 30 s; it does not poll.
These tests count what it asks PostgreSQL while it has nothing to do (pg_stat_statements with
`track = all` in a server of their own, so statements inside triggers and functions count too),
and check the three ways work still reaches it: a NOTIFY, its own timer (no NOTIFY at the due
time), and the look that a lost and regained LISTEN connection triggers. The delivery tests set
the safety look to an hour, so nothing but the path under test can deliver within their deadline.
Decided by counts and outcomes, never by how fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from notify_queue.embedded import EmbeddedPostgres
from notify_queue.models import Status
from notify_queue.providers.simulated import SimulatedProvider
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery import DeliveryRepository
from notify_queue.repositories.delivery_log import DeliveryLogRepository
from notify_queue.repositories.notifications import NotificationRepository
from notify_queue.repositories.schema import migrate
from notify_queue.services.delivery import DeliveryService
from notify_queue.services.notifications import NotificationService
from notify_queue.services.retention import DeliveryLogKeeper
from notify_queue.services.wakeups import DebouncedWaker
from notify_queue.settings import WorkerSettings
from notify_queue.worker.main import delivery_defaults, webhook_dispatcher
from notify_queue.worker.runner import SAFETY_LOOK_SECONDS, Worker
from notify_queue.worker.supervision import Health
from tests.receivers import WebhookReceiver
from tests.support import (
    directory_outside_pytest,
    eventually,
    new,
    notification_service,
    single_provider_router,
)

TASKS = ("claim", "listen", "complete", "housekeeping", "retention", "webhooks")
# Long enough that only the path under test can deliver within a test's deadline.
AN_HOUR = 3600.0
# The counted window, and what an idle worker may ask in it: the statements that close the
# rounds it was in when the window opened (a look's last read), nothing more. Before the worker
# waited on its timers it asked about 15 a second (this window: about 150).
WINDOW_SECONDS = 10.0
MOST_STATEMENTS = 12


@pytest.fixture(scope="module")
def counted_server() -> Iterator[EmbeddedPostgres]:
    """A server of this module's own with pg_stat_statements loaded (it needs a restart)."""
    with directory_outside_pytest("nq-idle-pg-") as root:
        server = EmbeddedPostgres(root / "data", delete_on_stop=True)
        try:
            with psycopg.connect(server.url(), autocommit=True) as conn:
                conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
                conn.execute("ALTER SYSTEM SET pg_stat_statements.track = 'all'")
                conn.execute("ALTER SYSTEM SET fsync = off")
            server.halt()
            server.resume()
            with psycopg.connect(server.url(), autocommit=True) as conn:
                conn.execute("CREATE DATABASE idle")
            with psycopg.connect(server.url("idle"), autocommit=True) as conn:
                conn.execute("CREATE EXTENSION pg_stat_statements")
            yield server
        finally:
            server.stop()


@contextlib.asynccontextmanager
async def idle_worker(
    url: str, *, safety_look_seconds: float = SAFETY_LOOK_SECONDS, **overrides: object
) -> AsyncIterator[Worker]:
    """A worker with every task of the `worker` role (claimer, listener, completer, housekeeping,
    retention, webhook relay) and the default settings (but `overrides`), once every task has
    done a round."""
    settings = WorkerSettings(**{"database_url": url, **overrides})
    health = Health()
    provider = SimulatedProvider(0.0, 0.0, 1.0)
    async with Database(url, pool_size=4, name="test-worker") as db:
        dispatcher, close_dispatcher = webhook_dispatcher(
            settings, db, health, look_seconds=safety_look_seconds
        )
        worker = Worker(
            DeliveryService(
                DeliveryRepository(db, delivery_defaults(settings)),
                priorities=settings.priorities,
                channels=settings.channels,
            ),
            single_provider_router(provider, db),
            dispatcher,
            concurrency=settings.concurrency,
            batch_size=settings.claim_size,
            poll_interval=settings.poll_interval,
            shutdown_grace_seconds=1.0,
            health=health,
            delivery_log=DeliveryLogKeeper(
                DeliveryLogRepository(db), retention_days=settings.retention
            ),
            lease_seconds=settings.lease_seconds,
            safety_look_seconds=safety_look_seconds,
        )
        task = asyncio.create_task(worker.run())
        try:

            async def settled() -> bool:
                assert not task.done(), "the worker stopped"
                return all(health.has_worked(name) for name in TASKS)

            await eventually(settled, timeout=60, what="every task of the worker done a round")
            yield worker
        finally:
            worker.stop()
            await task
            await close_dispatcher()


def _statements(url: str) -> list[tuple[int, str]]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            """SELECT calls, left(regexp_replace(query, '\\s+', ' ', 'g'), 80)
               FROM pg_stat_statements
               WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                 AND query NOT ILIKE '%pg_stat_statements%'
               ORDER BY calls DESC"""
        ).fetchall()
    return [(int(r[0]), str(r[1])) for r in rows]


async def _status(db: Database, id: uuid.UUID) -> Status:
    stored = await notification_service(db).get(id)
    assert stored is not None
    return stored.status


async def test_an_idle_worker_asks_the_database_almost_nothing(
    counted_server: EmbeddedPostgres,
) -> None:
    url = counted_server.url("idle")
    async with Database(url, pool_size=1) as db:
        await migrate(db)
    async with idle_worker(url):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_statements_reset()")
        await asyncio.sleep(WINDOW_SECONDS)  # the window itself: nothing to wait for
        statements = _statements(url)
    issued = sum(calls for calls, _ in statements)
    assert issued <= MOST_STATEMENTS, f"{issued} statements in {WINDOW_SECONDS:g}s: {statements}"


async def test_a_notification_created_while_the_worker_idles_is_delivered_by_its_notify(
    db: Database, database_url: str
) -> None:
    waker = DebouncedWaker(NotificationRepository(db).workers_wake)
    service = NotificationService(NotificationRepository(db), default_max_attempts=6, waker=waker)
    async with idle_worker(database_url, safety_look_seconds=AN_HOUR):
        created = await service.enqueue(new())
        await eventually(
            lambda: _is(db, created.notification.id, Status.SENT),
            timeout=60,
            what="SENT after the NOTIFY of its creation",
        )
    await waker.close()


async def _is(db: Database, id: uuid.UUID, status: Status) -> bool:
    return await _status(db, id) is status


async def test_a_scheduled_notification_is_delivered_by_the_timer_without_any_notify(
    db: Database, database_url: str
) -> None:
    # Written without a wake-up, before the worker starts: its first look sees it is not due
    # yet and sets its timer; no NOTIFY is ever sent, and the safety look is an hour away.
    send_at = datetime.now(UTC) + timedelta(seconds=3)
    created = await notification_service(db, announce=False).enqueue(new(send_at=send_at))
    async with idle_worker(database_url, safety_look_seconds=AN_HOUR):
        await eventually(
            lambda: _is(db, created.notification.id, Status.SENT),
            timeout=60,
            what="SENT at its due time by the worker's timer",
        )
    stored = await notification_service(db).get(created.notification.id)
    assert stored is not None and stored.sent_at is not None
    assert stored.sent_at >= send_at  # the claim never takes it early


async def test_a_hint_lost_with_the_listen_connection_is_recovered_by_the_reconnect(
    db: Database, database_url: str
) -> None:
    async with idle_worker(database_url, safety_look_seconds=AN_HOUR):
        # Written without a wake-up: the hint is lost, and the worker sleeps for an hour.
        created = await notification_service(db, announce=False).enqueue(new())
        with psycopg.connect(database_url, autocommit=True) as conn:
            cut = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database()"
                " AND application_name LIKE 'notify-queue-listen%'"
            ).fetchone()
        assert cut == (1,)
        await eventually(
            lambda: _is(db, created.notification.id, Status.SENT),
            timeout=60,
            what="SENT after the listen connection was lost and regained",
        )


async def test_a_webhook_retry_is_posted_at_its_time_not_at_the_end_of_the_lease(
    db: Database, database_url: str
) -> None:
    # The relay chooses its sleep while the event's first POST is in flight, when the event is
    # due at its lease's end (--webhook-timeout x 2 + 5 s: 125 s here). The failed POST's retry
    # is due 0.1 s later: recording it must wake the relay, or the retry (and, in a busy relay,
    # everything behind the sleep) waits for the lease. Before that wake-up this failed.
    receiver = await WebhookReceiver(fail_first=2).start()
    try:
        async with idle_worker(
            database_url,
            safety_look_seconds=AN_HOUR,
            webhook_url=receiver.url,
            webhook_timeout=60.0,
            webhook_backoff_base=0.1,
            webhook_backoff_max=0.2,
        ):
            await notification_service(db).enqueue(new())

            async def third_post() -> bool:
                return len(receiver.received) >= 3

            await eventually(third_post, timeout=60, what="the event posted a third time")
    finally:
        await receiver.stop()
