"""The webhook relay's HTTP client: one POST at a time per connection, connections kept per host.

A webhook POST is the relay's whole job, and aiohttp's client costs 156-173 µs of CPU per POST
where a bare HTTP/1.1 client on asyncio streams costs 38-58 µs (`benchmarks/post_client.py`).
This is that client, with what the aiohttp sessions it replaced gave the relay:

* the outbound guard, for URLs clients supplied (`guarded_poster`): a name is resolved through
  the same `GuardedResolver` (its verdict kept per host and TTL) and only a vetted address is
  dialled; a literal IP is checked against the allow-list before any connection. The operator's
  own `--webhook-url` goes through `trusted_poster`, unguarded;
* TLS verified against the URL's host name (the system's trust store, SNI);
* no proxies from the environment, and no redirects: a 3xx is an answer like any other;
* the answer's body read up to `RESPONSE_BODY_LIMIT_BYTES`, for the error text: a connection whose
  answer was not read to its end is closed, never reused;
* one timeout around the whole exchange (connecting, sending, the answer); a connection that timed
  out is closed.

Connections are kept alive per (scheme, host, port) for `IDLE_SECONDS`. A server may close its end
of an idle connection at any moment; a POST on a kept connection that fails before any byte of
the answer arrived is sent once more on a new connection (receivers drop repeats by `webhook-id`,
and a POST that reached nobody is not a delivery).
"""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

from aiohttp.abc import AbstractResolver
from yarl import URL

from notify_queue.errors import NotifyQueueError
from notify_queue.providers.outbound import (
    GUARD_TTL_SECONDS,
    RESPONSE_BODY_LIMIT_BYTES,
    GuardedResolver,
    OutboundAllowList,
    OutboundRefused,
    literal_ip_verdict,
    parse_ip,
)

# How long an idle connection is kept (aiohttp's default keep-alive, which the relay had).
IDLE_SECONDS = 15.0
# The status line and headers of an answer, at most.
_HEAD_LIMIT_BYTES = 64 * 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}


class Answer(NamedTuple):
    status: int
    body: bytes  # at most RESPONSE_BODY_LIMIT_BYTES of it


class PostFailed(NotifyQueueError):
    """No answer: the connection could not be made, broke, or the peer did not speak HTTP/1.1."""


class _Stale(Exception):
    """A kept connection the server had closed: nothing of an answer came back."""


class _Connection:
    __slots__ = ("reader", "returned_at", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.returned_at = 0.0

    def close(self) -> None:
        self.writer.close()


class Poster:
    """POSTs bodies to URLs; `guarded_poster` and `trusted_poster` make one."""

    def __init__(
        self,
        *,
        timeout_seconds: float,
        resolver: GuardedResolver | None,
        allow: OutboundAllowList | None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._timeout_seconds = timeout_seconds
        self._resolver = resolver
        self._allow = allow
        self._ssl = ssl_context or ssl.create_default_context()
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._swept_at = time.monotonic()

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> Answer:
        """The answer's status and the start of its body. Raises OutboundRefused (the guard),
        PostFailed (no answer) or TimeoutError (none within the timeout)."""
        try:
            target = URL(url)
            scheme, host = target.scheme, target.raw_host or ""
            if scheme not in _DEFAULT_PORTS or not host:
                raise ValueError("not http(s) with a host")
            port = target.port or _DEFAULT_PORTS[scheme]
            request = _request(target, port, body, headers)
        except ValueError as exc:  # UnicodeEncodeError too
            # Not the URL itself: its user info may hold a password, and this text is stored.
            raise PostFailed(f"connection error: cannot POST to this URL: {exc}") from None
        key = (scheme, host, port)
        async with asyncio.timeout(self._timeout_seconds):
            connection = self._kept(key)
            if connection is not None:
                try:
                    return await self._exchange(key, connection, request, kept=True)
                except _Stale:
                    pass
            connection = await self._dial(key)
            try:
                return await self._exchange(key, connection, request, kept=False)
            except _Stale as exc:  # a new connection closed at once: no answer
                raise PostFailed("connection error: the server closed the connection") from exc

    async def __aenter__(self) -> Poster:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()
        if self._resolver is not None:
            await self._resolver.close()

    # -- connections ----------------------------------------------------------------------------

    def _kept(self, key: tuple[str, str, int]) -> _Connection | None:
        now = time.monotonic()
        if now - self._swept_at > IDLE_SECONDS:
            self._sweep(now)
        kept = self._idle.get(key)
        while kept:
            connection = kept.pop()
            if now - connection.returned_at < IDLE_SECONDS and not connection.reader.at_eof():
                return connection
            connection.close()
        return None

    def _sweep(self, now: float) -> None:
        """Close the connections idle too long, of every host: a relay POSTs to many receivers,
        and a host it stopped sending to would otherwise keep its sockets (and the server's)."""
        self._swept_at = now
        for key, kept in list(self._idle.items()):
            fresh = [c for c in kept if now - c.returned_at < IDLE_SECONDS]
            for connection in kept:
                if now - connection.returned_at >= IDLE_SECONDS:
                    connection.close()
            if fresh:
                self._idle[key] = fresh
            else:
                del self._idle[key]

    async def _dial(self, key: tuple[str, str, int]) -> _Connection:
        scheme, host, port = key
        tls = scheme == "https"
        failure: OSError | None = None
        for address in await self._addresses(host, port):
            try:
                reader, writer = await asyncio.open_connection(
                    address,
                    port,
                    ssl=self._ssl if tls else None,
                    server_hostname=host if tls else None,
                    limit=_HEAD_LIMIT_BYTES,
                )
            except OSError as exc:  # refused, unreachable, TLS handshake or certificate
                failure = exc
                continue
            return _Connection(reader, writer)
        raise PostFailed(f"connection error: cannot connect to {host}:{port}: {failure}")

    async def _addresses(self, host: str, port: int) -> list[str]:
        """Where to dial: the vetted addresses when guarded, else the host as it is."""
        if self._resolver is None or self._allow is None:
            return [host]
        reason = literal_ip_verdict(self._allow, host)
        if reason is not None:
            raise OutboundRefused(host, reason)
        if parse_ip(host) is not None:
            return [host]
        try:
            vetted = await self._resolver.resolve(host, port, socket.AF_UNSPEC)
        except OSError as exc:
            raise PostFailed(f"connection error: cannot resolve {host}: {exc}") from None
        return [v["host"] for v in vetted]

    # -- one exchange ---------------------------------------------------------------------------

    async def _exchange(
        self, key: tuple[str, str, int], connection: _Connection, request: bytes, *, kept: bool
    ) -> Answer:
        reader = connection.reader
        answered = False
        try:
            connection.writer.write(request)
            await connection.writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            answered = True
            status, version_11, fields = _parse_head(head)
            while 100 <= status < 200:  # interim answers (100 Continue, 103 Early Hints)
                if status == 101:
                    raise PostFailed("connection error: the server switched protocols")
                status, version_11, fields = _parse_head(await reader.readuntil(b"\r\n\r\n"))
            body, complete = await _read_body(reader, status, fields)
        except asyncio.IncompleteReadError as exc:
            connection.close()
            if kept and not answered and not exc.partial:
                raise _Stale from None
            raise PostFailed("connection error: the server closed the connection") from None
        except (ConnectionResetError, BrokenPipeError) as exc:
            connection.close()
            if kept and not answered:
                raise _Stale from None
            raise PostFailed(f"connection error: {type(exc).__name__}: {exc}") from None
        except asyncio.LimitOverrunError:
            connection.close()
            raise PostFailed(
                f"connection error: answer headers over {_HEAD_LIMIT_BYTES} bytes"
            ) from None
        except OSError as exc:
            connection.close()
            raise PostFailed(f"connection error: {type(exc).__name__}: {exc}") from None
        except BaseException:  # a malformed answer, the timeout, a cancellation
            connection.close()
            raise
        if complete and version_11 and "close" not in fields.get("connection", ""):
            connection.returned_at = time.monotonic()
            self._idle.setdefault(key, []).append(connection)
        else:
            connection.close()
        return Answer(status, body)


def guarded_poster(
    *,
    allow: list[str],
    timeout_seconds: float,
    resolver: AbstractResolver | None = None,
    guard_ttl_seconds: float = GUARD_TTL_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    ssl_context: ssl.SSLContext | None = None,
) -> Poster:
    """For URLs clients supplied; call it inside the running event loop.

    `allow` holds CIDRs and host names that may be reached although they are not public.
    `resolver` replaces the system's DNS under the guard (tests use a fixed table),
    `guard_ttl_seconds` is how long a host's verdict is kept (0: every dial resolves and vets),
    `clock` the monotonic clock it is measured with (tests step it). A forbidden destination
    raises `OutboundRefused` before anything is sent to it.
    """
    allow_list = OutboundAllowList.parse(allow)
    guarded = GuardedResolver(allow_list, resolver, ttl_seconds=guard_ttl_seconds, clock=clock)
    return Poster(
        timeout_seconds=timeout_seconds, resolver=guarded, allow=allow_list, ssl_context=ssl_context
    )


def trusted_poster(*, timeout_seconds: float, ssl_context: ssl.SSLContext | None = None) -> Poster:
    """For the operator's own `--webhook-url`: reached wherever it is."""
    return Poster(
        timeout_seconds=timeout_seconds, resolver=None, allow=None, ssl_context=ssl_context
    )


def _request(target: URL, port: int, body: bytes, headers: Mapping[str, str]) -> bytes:
    host = target.raw_host or ""
    if ":" in host:
        host = f"[{host}]"
    if port != _DEFAULT_PORTS[target.scheme]:
        host = f"{host}:{port}"
    lines = [
        f"POST {target.raw_path_qs or '/'} HTTP/1.1",
        f"Host: {host}",
        f"Content-Length: {len(body)}",
        "User-Agent: notify-queue",
    ]
    if target.user is not None:
        credentials = f"{target.user}:{target.password or ''}".encode()
        lines.append(f"Authorization: Basic {base64.b64encode(credentials).decode()}")
    for name, value in headers.items():
        if any(c in name or c in value for c in "\r\n"):
            raise PostFailed(f"connection error: header {name!r} holds a line break")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _parse_head(head: bytes) -> tuple[int, bool, dict[str, str]]:
    """(status, HTTP/1.1?, the header fields this client reads, lower-cased)."""
    status_line, *lines = head[:-4].split(b"\r\n")
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0") or not parts[1].isdigit():
        raise PostFailed(f"connection error: not an HTTP/1.1 answer: {status_line[:40]!r}")
    fields: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(b":")
        key = name.strip().lower().decode("latin-1")
        if sep and key in ("content-length", "transfer-encoding", "connection"):
            fields[key] = value.strip().lower().decode("latin-1")
    return int(parts[1]), parts[0] == b"HTTP/1.1", fields


async def _read_body(
    reader: asyncio.StreamReader, status: int, fields: dict[str, str]
) -> tuple[bytes, bool]:
    """The body, up to the limit, and whether it was read to its end (the connection reusable)."""
    limit = RESPONSE_BODY_LIMIT_BYTES
    if status in (204, 304):
        return b"", True
    if "chunked" in fields.get("transfer-encoding", ""):
        body = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size_text = size_line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise PostFailed("connection error: a malformed chunked answer") from None
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailer fields
                    pass
                return bytes(body), True
            if len(body) + size > limit:
                body += await reader.readexactly(limit - len(body))
                return bytes(body), False
            body += await reader.readexactly(size)
            await reader.readexactly(2)
    length_text = fields.get("content-length")
    if length_text is not None:
        if not length_text.isdigit():
            raise PostFailed(f"connection error: Content-Length {length_text!r}")
        length = int(length_text)
        if length > limit:
            return await reader.readexactly(limit), False
        return await reader.readexactly(length), True
    # Neither: the body runs to the end of the connection.
    body = bytearray()
    while len(body) < limit:
        chunk = await reader.read(limit - len(body))
        if not chunk:
            break
        body += chunk
    return bytes(body), False
