"""`notify-queue up`: the whole system on one machine, for trying it and for development.

An embedded PostgreSQL under --data-dir (unless --database-url is given), the schema migrated,
the HTTP API and a worker with the simulated provider, all in this one process; with
--kubernetes also a local kube-apiserver (built by scripts/build-k8s-binaries.sh) with the CRDs
installed and the operator running against it. Ctrl-C (or SIGTERM) stops everything cleanly:
the worker hands back what it has claimed, the API finishes its requests, the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading

from notify_queue.logs import redact_url
from notify_queue.settings import Settings

log = logging.getLogger(__name__)


async def run_up(settings: Settings) -> None:
    import uvicorn

    from notify_queue.api.app import create_app
    from notify_queue.embedded import EmbeddedPostgres
    from notify_queue.repositories.db import Database
    from notify_queue.repositories.schema import migrate
    from notify_queue.worker.main import run_worker

    embedded = None
    if settings.database_url is None:
        embedded = await asyncio.to_thread(EmbeddedPostgres, settings.data_dir / "postgres")
        settings = settings.model_copy(update={"database_url": embedded.url()})
    url = settings.require_database_url()
    log.info("database: %s", redact_url(url))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    cluster = None
    operator_stop = threading.Event()
    try:
        async with Database(
            url, pool_size=settings.database_pool_size, name="notify-queue-up"
        ) as db:
            await migrate(db)
            server = uvicorn.Server(
                uvicorn.Config(
                    create_app(settings, db=db),
                    host=settings.host,
                    port=settings.port,
                    log_level="warning",
                    lifespan="on",
                )
            )
            server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
            tasks = [
                asyncio.create_task(server.serve(), name="api"),
                asyncio.create_task(run_worker(settings, db=db, stop=stop), name="worker"),
            ]
            if settings.kubernetes:
                from notify_queue.devcluster import LocalControlPlane
                from notify_queue.operator.main import run_operator

                cluster = LocalControlPlane(settings.data_dir / "kubernetes")
                await asyncio.to_thread(cluster.start)
                await asyncio.to_thread(cluster.install_crds)
                log.info("kubernetes: export KUBECONFIG=%s", cluster.kubeconfig)
                # kopf runs on its own loop in a thread: when it stops it cancels every task its
                # loop created while it ran, which here would be the API's and the worker's.
                operator = asyncio.to_thread(
                    asyncio.run,
                    run_operator(settings, kubeconfig=cluster.kubeconfig, stop_flag=operator_stop),
                )
                tasks.append(asyncio.create_task(operator, name="operator"))
            log.info(
                "Notify Queue is up: API on http://%s:%d (try: curl -s http://%s:%d/status); Ctrl-C stops",
                settings.host,
                settings.port,
                settings.host,
                settings.port,
            )
            stopper = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
            stop.set()
            operator_stop.set()
            server.should_exit = True
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for task in done:
                if task is not stopper and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        if cluster is not None:
            await asyncio.to_thread(cluster.stop)
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
        log.info("stopped")
