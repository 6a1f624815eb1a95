"""The API's uvicorn server: its limits, and a header deadline uvicorn does not have.

uvicorn bounds idle kept-alive connections and the connections in flight, but not the time a
header block may take, nor (with httptools, its fast parser) the header block's size: a client
sending one header byte every few seconds holds a connection for as long as it likes. The HTTP
protocol here is uvicorn's httptools protocol with both bounds added; it answers 408 or 431
(problem+json) and closes. The body's own deadline is the app's (`limits`), where the 408 can
be a problem like every other answer. docs/security.md says what each limit stops.
"""

from __future__ import annotations

import asyncio
import logging
from http import HTTPStatus
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from notify_queue.api.problems import PROBLEM_MEDIA_TYPE, problem_bytes
from notify_queue.settings import ApiSettings

log = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_SECONDS = 10  # requests in flight get this long to finish on SIGTERM


class ApiServerConfig(uvicorn.Config):
    """uvicorn's configuration and the header limits its protocol reads (a module-level class,
    so `--api-workers` can hand it to each worker process)."""

    header_timeout_seconds: float = 10.0
    max_header_bytes: int = 64 * 1024


def server_config(app: Any, settings: ApiSettings, **options: Any) -> ApiServerConfig:
    """The server of `app` (an ASGI app, or the factory's import path) with the API's limits."""
    config = ApiServerConfig(
        app,
        host=settings.host,
        port=settings.port,
        http=GuardedHttpProtocol,
        lifespan="on",
        log_config=None,  # keep the program's logging (text or json), not uvicorn's own
        server_header=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        limit_concurrency=settings.api_max_connections,
        timeout_keep_alive=max(1, round(settings.keep_alive_seconds)),
        **options,
    )
    config.header_timeout_seconds = settings.header_timeout_seconds
    config.max_header_bytes = settings.max_header_bytes
    return config


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing a connection whose header block is late or large.

    The deadline runs from the connection's start, and again from the end of each response
    (a kept-alive connection's next request), until the header block is complete.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        limits = config if isinstance(config, ApiServerConfig) else ApiServerConfig
        self._timeout = limits.header_timeout_seconds
        self._max_bytes = limits.max_header_bytes
        self._deadline: asyncio.TimerHandle | None = None
        self._header_bytes = 0  # bytes received since the header block began, while it is open

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        awaiting = self._deadline is not None
        super().data_received(data)
        if awaiting and self._deadline is not None:  # the header block is still open
            self._header_bytes += len(data)
            if self._header_bytes > self._max_bytes:
                self._refuse(431, f"the request's headers are larger than {self._max_bytes} bytes")

    def on_headers_complete(self) -> None:
        self._stop_deadline()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.timeout_keep_alive_task is not None:
            self._await_headers()  # idle and kept alive: the next request's headers are due

    def _await_headers(self) -> None:
        self._stop_deadline()
        self._header_bytes = 0
        self._deadline = self.loop.call_later(self._timeout, self._headers_late)

    def _stop_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_late(self) -> None:
        self._deadline = None
        if not self._header_bytes:
            self.transport.close()  # nothing sent at all: no one to answer
            return
        log.info(
            "closed a connection from %s: its request headers took over %g s",
            _peer(self.client),
            self._timeout,
        )
        self._refuse(408, f"the request's headers did not arrive within {self._timeout:g} s")

    def _refuse(self, status: int, detail: str) -> None:
        self._stop_deadline()
        if self.transport.is_closing():
            return
        body = problem_bytes(status, detail)
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
            f"content-type: {PROBLEM_MEDIA_TYPE}\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        self.transport.close()


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "an unknown peer"
