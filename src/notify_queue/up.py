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
import errno
import logging
import signal
import socket
import threading
from collections.abc import Iterator

import uvicorn

from notify_queue.errors import CannotListen, NotifyQueueError
from notify_queue.logs import redact_url
from notify_queue.settings import UpSettings

log = logging.getLogger(__name__)


class _SignalsAreOurs(logging.Filter):
    """kopf warns "OS signals are ignored: running not in the main thread" whenever it runs in a
    thread. Here that is by design: `up` handles SIGINT/SIGTERM and stops kopf by its stop flag."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("OS signals are ignored")


def _listen(host: str, port: int) -> socket.socket:
    """The API's socket, bound before anything starts: a taken port stops `up` at once, in one
    line, instead of after it has said it is up."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise CannotListen(
                f"cannot listen on {host}:{port}: another process has the port; stop it or "
                "choose another with --port (NOTIFY_QUEUE_PORT)"
            ) from None
        raise CannotListen(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


async def _serving(server: uvicorn.Server, task: asyncio.Task[None]) -> None:
    """Return once the API accepts requests (uvicorn's `started`), or raise what stopped it."""
    while not server.started:
        if task.done():
            task.result()
            raise NotifyQueueError("the API stopped before it served (its log says why)")
        await asyncio.sleep(0.05)


class _QuietServer(uvicorn.Server):
    """uvicorn without its own signal handling: `up` owns SIGINT/SIGTERM and stops every part."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def run_up(settings: UpSettings) -> None:
    from notify_queue.api.app import create_app
    from notify_queue.api.server import server_config
    from notify_queue.embedded import EmbeddedPostgres
    from notify_queue.repositories.db import Database
    from notify_queue.repositories.schema import EnqueueDefaults, migrate
    from notify_queue.worker.main import run_worker

    listening = _listen(settings.host, settings.port)
    embedded = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    cluster = None
    operator_stop = threading.Event()
    started = False  # "stopped" is said only of a system that got as far as its database
    try:
        if settings.database_url is None:
            embedded = await asyncio.to_thread(EmbeddedPostgres, settings.data_dir / "postgres")
            settings = settings.model_copy(update={"database_url": embedded.url()})
        url = settings.require_database_url()
        log.info("database: %s", redact_url(url))
        started = True
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with Database(
            url,
            pool_size=settings.database_pool_size,
            name="notify-queue-up",
            acquire_timeout_seconds=settings.database_timeout,
            session_url=settings.listen_database_url,
            prepared_statements=settings.prepares_on_server,
        ) as db:
            defaults = EnqueueDefaults.configured(settings)
            await migrate(db, enqueue_defaults=defaults)
            server = _QuietServer(
                server_config(create_app(settings, db=db), settings, log_level="warning")
            )
            api_task = asyncio.create_task(server.serve(sockets=[listening]), name="api")
            tasks = [
                api_task,
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
                # --metrics-port is the worker's here: the operator serving on it as well would
                # find the port taken.
                operator_settings = settings.model_copy(update={"metrics_port": None})
                logging.getLogger("kopf._core.reactor.running").addFilter(_SignalsAreOurs())
                operator = asyncio.to_thread(
                    asyncio.run,
                    run_operator(
                        operator_settings, kubeconfig=cluster.kubeconfig, stop_flag=operator_stop
                    ),
                )
                tasks.append(asyncio.create_task(operator, name="operator"))
            await _serving(server, api_task)
            api = f"http://{settings.host}:{settings.port}"
            if cluster is not None:
                # No Service fronts this API (the API server never proxies to loopback), so
                # `kubectl notify` is told where it is (docs/kubectl-notify.md).
                log.info("kubectl notify: export NOTIFY_QUEUE_API_URL=%s", api)
            log.info(
                "Notify Queue is up: API on %s (try: curl -s %s/status); Ctrl-C stops", api, api
            )
            stopper = asyncio.create_task(stop.wait())
            await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            stop.set()
            operator_stop.set()
            server.should_exit = True
            # Every part stops; the first failure (if a part died rather than being stopped) is
            # raised once all have finished.
            results = await asyncio.gather(*tasks, return_exceptions=True)
            failures = [r for r in results if isinstance(r, BaseException)]
            if failures:
                raise failures[0]
    finally:
        listening.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        if cluster is not None:
            await asyncio.to_thread(cluster.stop)
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
        if started:
            log.info("stopped")
