"""Wiring of the operator role: settings in, kopf and four background tasks running, until stopped.

kopf runs in-process through `kopf.operator(...)` with handlers on a dedicated
`kopf.OperatorRegistry`, so tests (and `notify-queue up --kubernetes`) run the real operator in
their own process. It watches one namespace (`--namespace`) or the whole cluster. Peering is off
(`standalone`): the chart runs one replica with the Recreate strategy; a second replica would not
duplicate rows (idempotency keys) or garble statuses (the status writer takes an advisory lock),
see docs/operator.md.

Beside kopf, single tasks do the per-change work: the status writer (outbox → .status), the TTL
sweeper, the waiting refresher, the worker scaler and the policies' Secret refresher; and once
per start, the clean-up after Notifications deleted while no operator ran. kopf's cleanup activity
stops them, before kopf goes on to cancel whatever tasks it finds left.

On --metrics-port one small HTTP server serves /metrics (this operator's own figures) and
/healthz, which relays kopf's liveness endpoint (kopf serves it on a loopback port of its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import aiohttp.web
import kopf
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from notify_queue.errors import DatabaseUnavailable, SchemaNotCurrent
from notify_queue.operator import metrics
from notify_queue.operator.handlers import register_handlers
from notify_queue.operator.kubeapi import (
    KubeApi,
    KubeRefused,
    KubeUnavailable,
    load_kube_configuration,
)
from notify_queue.operator.mirror import NotificationMirror, PolicyMirror, TemplateMirror
from notify_queue.operator.refresh import WaitingRefresher
from notify_queue.operator.scaler import WorkerScaler
from notify_queue.operator.status import StatusWriter
from notify_queue.operator.storage import (
    MemoryDiffBaseStorage,
    MemoryProgressStorage,
    SettledForgettingMemories,
)
from notify_queue.operator.sweeper import TtlSweeper
from notify_queue.operator.waiting import pause
from notify_queue.repositories.db import Database
from notify_queue.repositories.escalations import EscalationRepository
from notify_queue.repositories.kube import KubeRepository
from notify_queue.repositories.notifications import NotificationRepository
from notify_queue.repositories.policies import PolicyRepository
from notify_queue.repositories.recipients import RecipientRepository
from notify_queue.repositories.schema import missing_steps
from notify_queue.services.escalations import EscalationService
from notify_queue.services.kube import ACKNOWLEDGED
from notify_queue.services.notifications import NotificationService
from notify_queue.services.recipients import RecipientService
from notify_queue.services.rendering import RenderPool
from notify_queue.services.waiting import LiveLanes
from notify_queue.services.wakeups import DebouncedWaker
from notify_queue.settings import OperatorSettings

log = logging.getLogger(__name__)

# kopf's annotations and finalizer carry our group's name: `kubectl get -o yaml` says whose.
FINALIZER = "notifyqueue.io/finalizer"
ANNOTATION_PREFIX = "notifyqueue.io"

StopFlag = asyncio.Event | threading.Event


def operator_settings(
    progress: MemoryProgressStorage, diffbase: MemoryDiffBaseStorage
) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    # kopf's own log lines become Events only from WARNING up: a Notification's Events then say
    # what matters (Accepted, Rejected, DeadLettered), not every handler run.
    settings.posting.level = logging.WARNING
    # Only the policies and templates carry it: a Notification's clean-up needs none (handlers.py).
    settings.persistence.finalizer = FINALIZER
    # Progress and the last-handled essence in memory, never on the object: the status writer's
    # patch is then the only write of a Notification (storage.py).
    settings.persistence.progress_storage = progress
    settings.persistence.diffbase_storage = diffbase
    settings.peering.standalone = True
    # No watching of CRDs and namespaces at run time: the CRDs exist before the operator starts
    # (Helm's crds/, `up --kubernetes`), and the chart's RBAC then needs no cluster-wide read
    # of CRDs or namespaces (kopf would retry and warn on every start without it).
    settings.scanning.disabled = True
    return settings


async def run_operator(
    settings: OperatorSettings,
    *,
    kubeconfig: Path | None = None,
    stop_flag: StopFlag | None = None,
    ready_flag: StopFlag | None = None,
) -> None:
    """Run the operator until SIGTERM/SIGINT (when in the main thread) or `stop_flag`.

    `kubeconfig`: credentials to use; default $KUBECONFIG, ~/.kube/config, else in-cluster.
    `ready_flag` is set once kopf has started its watches.
    """
    # kopf's liveness server logs every probe at INFO; a probe every few seconds is not news.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    kube = KubeApi(load_kube_configuration(kubeconfig))
    db = Database(
        settings.require_database_url(),
        pool_size=settings.database_pool_size,
        name="notify-queue-operator",
        session_url=settings.listen_database_url,
        prepared_statements=settings.prepares_on_server,
    )
    try:
        await db.open()
        # Every step this release needs; newer ones are fine (the next release's `migrate`
        # runs while this operator still serves).
        missing = await missing_steps(db)
        if missing:
            raise SchemaNotCurrent(
                f"database schema lacks {', '.join(missing)}, which this operator needs; "
                "run `notify-queue migrate`"
            )
        await _run(settings, db, kube, stop_flag=stop_flag, ready_flag=ready_flag)
    finally:
        await kube.close()
        await _close_pool(db)


async def _close_pool(db: Database) -> None:
    """Close the pool even when kopf has cancelled its helpers.

    On shutdown kopf cancels every task created after it started. After a database outage
    those include the pool's reconnect workers, and the pool's close then re-raises their
    CancelledError although nobody cancelled us: the pool is closed all the same.
    """
    try:
        await db.close()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        log.debug("database pool closed; its cancelled helpers were ignored")


async def _run(
    settings: OperatorSettings,
    db: Database,
    kube: KubeApi,
    *,
    stop_flag: StopFlag | None,
    ready_flag: StopFlag | None,
) -> None:
    namespace = settings.namespace
    links = KubeRepository(db)
    # A Notification's template renders in worker processes, off kopf's event loop.
    renderer = RenderPool()
    repository = NotificationRepository(db, default_webhook_url=settings.webhook_url)
    # Idle workers wait for this NOTIFY (they do not poll), as for the API's creates.
    waker = DebouncedWaker(repository.workers_wake)
    notifications = NotificationService(
        repository,
        default_max_attempts=settings.max_attempts,
        waker=waker,
        renderer=renderer,
    )
    policies = PolicyMirror(
        PolicyRepository(db), kube, secret_refresh_seconds=settings.secret_refresh_interval
    )
    registry = kopf.OperatorRegistry()
    progress = MemoryProgressStorage(prefix=ANNOTATION_PREFIX)
    diffbase = MemoryDiffBaseStorage(prefix=ANNOTATION_PREFIX, kept=(ACKNOWLEDGED,))
    notification_mirror = NotificationMirror(
        notifications,
        links,
        kube,
        database_concurrency=max(settings.database_pool_size - 2, 1),
        escalations=EscalationService(
            EscalationRepository(db, default_webhook_url=settings.webhook_url),
            default_max_attempts=settings.max_attempts,
            waker=waker,
            renderer=renderer,
        ),
        default_region=settings.default_region,
    )

    memories = SettledForgettingMemories()
    for store, size in (
        ("kopf", lambda: len(memories)),
        ("diffbase", lambda: len(diffbase)),
        ("progress", lambda: len(progress)),
    ):
        metrics.OBJECTS_REMEMBERED.labels(store).set_function(size)

    def forget(uid: str) -> None:
        progress.forget(uid)
        diffbase.forget(uid)

    register_handlers(
        registry,
        kube=kube,
        forget=forget,
        notifications=notification_mirror,
        policies=policies,
        templates=TemplateMirror(RecipientService(RecipientRepository(db)), kube),
    )
    sweeper = TtlSweeper(links, kube, namespace=namespace)
    lanes = LiveLanes(repository.workers)
    writer = StatusWriter(
        links,
        kube,
        namespace=namespace,
        batch_size=settings.status_batch_size,
        patches_per_second=settings.status_patches_per_second,
        coalesce_seconds=settings.status_coalesce_seconds,
        on_finished=sweeper.poke,
        on_gone=lambda uid: notification_mirror.deleted(uid=uid),
        lanes=lanes,
    )
    refresher = WaitingRefresher(links, lanes, writer, namespace=namespace)
    scaler = WorkerScaler(
        links, kube, namespace=namespace, interval_seconds=settings.scale_interval
    )

    async def clean_up_after_deletions_while_away(stop: asyncio.Event) -> None:
        # Once per start: a Notification deleted while no operator ran sent no DELETED event.
        while not stop.is_set():
            try:
                await notification_mirror.release_deleted_while_away(namespace=namespace)
                break
            except (DatabaseUnavailable, KubeUnavailable, KubeRefused) as exc:
                log.warning("clean-up of deleted Notifications paused: %s", exc)
                await pause(stop, 2.0)
        await stop.wait()

    stop = asyncio.Event()
    background: list[tuple[str, Callable[[asyncio.Event], Awaitable[None]]]] = [
        ("deletion clean-up", clean_up_after_deletions_while_away),
        ("status writer", writer.run),
        ("ttl sweeper", sweeper.run),
        ("waiting refresher", refresher.run),
        ("worker scaler", scaler.run),
        ("secret refresher", policies.run),
    ]
    tasks = [asyncio.create_task(_guarded(name, run, stop), name=name) for name, run in background]
    liveness = (
        f"http://127.0.0.1:{_free_port()}/healthz" if settings.metrics_port is not None else None
    )
    health = (
        await _serve_metrics(settings.host, settings.metrics_port, liveness)
        if settings.metrics_port is not None and liveness is not None
        else None
    )

    async def stop_background(**_: object) -> None:
        # kopf's cleanup activity runs once its own tasks are done, and before it cancels "hung"
        # tasks (every task created after it started: our tasks' helpers). Stopping ours here
        # lets it find none, so a shutdown takes well under a second.
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await kube.flush_events()

    kopf.on.cleanup(id="stop_background", registry=registry)(stop_background)
    log.info("operator started: %s", f"namespace {namespace}" if namespace else "all namespaces")
    try:
        await kopf.operator(
            registry=registry,
            settings=operator_settings(progress, diffbase),
            memories=memories,
            clusterwide=namespace is None,
            namespaces=[namespace] if namespace else (),
            standalone=True,
            liveness_endpoint=liveness,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        if health is not None:
            await health.cleanup()
        await waker.close()
        await renderer.close()
        log.info("operator stopped")


async def _guarded(
    name: str, run: Callable[[asyncio.Event], Awaitable[None]], stop: asyncio.Event
) -> None:
    """Run a background task; if it crashes, log and start it again (after a pause)."""
    while not stop.is_set():
        try:
            await run(stop)
        except Exception:
            log.exception("%s crashed; restarting it in 1s", name)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _serve_metrics(host: str, port: int, liveness: str) -> aiohttp.web.AppRunner:
    """/metrics and /healthz on one port (the one the chart probes)."""

    async def metrics(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(
            body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def healthz(_: aiohttp.web.Request) -> aiohttp.web.Response:
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
                async with session.get(liveness) as response:
                    return aiohttp.web.Response(
                        status=response.status,
                        body=await response.read(),
                        content_type="application/json",
                    )
        except (aiohttp.ClientError, TimeoutError) as exc:
            return aiohttp.web.json_response({"error": f"kopf liveness: {exc}"}, status=503)

    app = aiohttp.web.Application()
    app.add_routes([aiohttp.web.get("/metrics", metrics), aiohttp.web.get("/healthz", healthz)])
    runner = aiohttp.web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    await aiohttp.web.TCPSite(runner, host, port).start()
    return runner
