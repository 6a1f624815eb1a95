"""Request body limits in size and time, as pure ASGI middleware, so an oversized body is never
held in memory and a trickled one never holds a connection for long.

Size: a declared `Content-Length` over the limit is answered 413 before the application runs at
all; a body without one (chunked) is counted as it streams in, and the first chunk past the limit
stops it with 413, having held at most the limit plus one chunk. Time: the whole body must arrive
within a deadline from the request's start, or it is answered 408. Every answer is problem+json
and closes the connection, as the rest of the body is unread. A client that goes away before its
body is read is one log line, not a traceback (docs/security.md).
"""

from __future__ import annotations

import asyncio
import logging

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from notify_queue.api.problems import PROBLEM_MEDIA_TYPE, problem_bytes

log = logging.getLogger(__name__)


class BodyTooLarge(HTTPException):
    """Raised from `receive` when a streamed body passes the limit; the problem handlers (or this
    middleware, if nothing else answered) turn it into a 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than {limit} bytes")


class BodyTooSlow(HTTPException):
    """Raised from `receive` when the body is not complete by its deadline: a 408."""

    def __init__(self, seconds: float) -> None:
        super().__init__(
            408,
            f"the request body did not arrive within {seconds:g} s",
            headers={"Connection": "close"},
        )


class BodyLimits:
    def __init__(self, app: ASGIApp, *, max_body_bytes: int, body_timeout_seconds: float) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_seconds = body_timeout_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await self._reject(send)
            return

        received = 0
        body_complete = False
        response_started = False
        deadline = asyncio.get_running_loop().time() + self.body_timeout_seconds

        async def limited_receive() -> Message:
            nonlocal received, body_complete
            if body_complete:  # what follows the body is the disconnect, awaited at leisure
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise BodyTooSlow(self.body_timeout_seconds) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise BodyTooLarge(self.max_body_bytes)
                body_complete = not message.get("more_body", False)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if response_started:
                raise
            await self._reject(send)
        except ClientDisconnect:
            # Nothing to answer and nothing wrong with this server: one line, no traceback.
            client = scope.get("client")
            log.info(
                "%s %s: the client went away before its body arrived (from %s)",
                scope.get("method"),
                scope.get("path"),
                f"{client[0]}:{client[1]}" if client else "an unknown peer",
            )

    async def _reject(self, send: Send) -> None:
        body = problem_bytes(413, f"the request body is larger than {self.max_body_bytes} bytes")
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server rejects a malformed Content-Length itself
    return None
