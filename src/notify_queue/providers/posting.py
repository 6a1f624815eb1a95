"""The webhook relay's HTTP client: one POST at a time per connection, connections kept per host.

A webhook POST is the relay's whole job, and aiohttp's client costs about three times the CPU per
POST of a lean HTTP/1.1 client (`benchmarks/probes/post_client.py`). This is that
client: an asyncio protocol per connection, its answers read by llhttp (`httptools`, the C parser
behind uvicorn) rather than by hand, so framing is judged the way RFC 9112 asks. It keeps what the
aiohttp sessions it replaced gave the relay:

* the outbound guard, for URLs clients supplied (`guarded_poster`): a name is resolved through
  the same `GuardedResolver` (its verdict kept per host and TTL) and only a vetted address is
  dialled; a literal IP is checked against the allow-list before any connection. The operator's
  own `--webhook-url` goes through `trusted_poster`, unguarded;
* TLS verified against the URL's host name (the system's trust store, SNI);
* no proxies from the environment, and no redirects: a 3xx is an answer like any other;
* the answer's body read up to `RESPONSE_BODY_LIMIT_BYTES`, for the error text;
* one timeout around the whole exchange (connecting, sending, the answer); a connection that timed
  out is closed.

What the parser refuses is a failed attempt whose reason is llhttp's: malformed status line or
fields, a Content-Length that is not all ASCII digits or overflows, two Content-Length fields,
Content-Length with Transfer-Encoding, a chunk size that is not hex or overflows (RFC 9112
sections 6.1-6.3 and 7.1). A connection goes back to the pool only when its answer ended exactly
where its framing said, the framing allows keep-alive, and nothing else came with it: a byte
after the answer, or one arriving while the connection is idle, closes it, so an answer is never
read as the next event's. (Bytes a server sends after the next request went out cannot be told
from that request's answer; HTTP/1.1 has no way to, which is why nothing suspicious is kept.)

A host with several vetted addresses is dialled the happy-eyeballs way (RFC 8305): the families
interleaved, a new attempt every `HAPPY_EYEBALLS_DELAY_SECONDS` or as soon as one fails, the first
connection made wins, so an IPv6 route that drops packets costs a quarter second, not the timeout.

Connections are kept alive per (scheme, host, port) for `IDLE_SECONDS`. A server may close its end
of an idle connection at any moment, so a kept connection is checked just before it is written to:
one whose socket holds anything (the server's end of file, or bytes nobody asked for) is closed
and the POST goes out on a new connection, nothing of it having been written. Once a byte of the
request is written, the POST is never sent again by this client: a connection that then closes
without an answer is the attempt's failure (the outcome unknown; the relay retries the event
later, as one more counted attempt), so one attempt is at most one POST (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import base64
import select
import socket
import ssl
import time
from asyncio.staggered import staggered_race
from collections.abc import Callable, Mapping
from functools import partial
from typing import NamedTuple

import httptools
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
# RFC 8305's recommended "Connection Attempt Delay".
HAPPY_EYEBALLS_DELAY_SECONDS = 0.25
# The status line and headers of an answer, at most.
_HEAD_LIMIT_BYTES = 64 * 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}


class Answer(NamedTuple):
    status: int
    body: bytes  # at most RESPONSE_BODY_LIMIT_BYTES of it


class PostFailed(NotifyQueueError):
    """No answer: the connection could not be made, broke, or the peer did not speak HTTP/1.1."""


class _Refused(Exception):
    """An answer this client will not read, raised inside a parser callback."""


class _Connection(asyncio.Protocol):
    """One connection, and the answer it is reading: fed through llhttp (its callbacks are the on_*
    methods; one parser per connection, ready for the next answer once one ended cleanly). An
    exchange ends as soon as its answer is complete; whatever arrives afterwards, in the same read
    or later, marks the connection unfit to reuse."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.returned_at = 0.0
        self.reusable = False
        self._parser = httptools.HttpResponseParser(self)
        # The exchange under way; `_over` once its answer (or failure) is known.
        self.answer: asyncio.Future[Answer] | None = None
        self._over = True
        self.received = 0  # bytes of the answer so far
        self._status = 0
        self._body = bytearray()
        self._head_bytes = 0  # fed while the head was incomplete: a head that never ends
        self._field_bytes = 0  # of the fields read: a head that ends, too late
        self._headers_done = False
        self._framed = False  # Content-Length or chunked: the close is not the end of the body

    # -- the client's side ------------------------------------------------------------------------

    def usable(self) -> bool:
        return self.reusable and self.transport is not None and not self.transport.is_closing()

    def quiet(self) -> bool:
        """Whether an idle connection's socket has nothing waiting: a server's end of file, or bytes
        nobody asked for, that the event loop has not read yet. Checked just before a kept
        connection is written to, so a connection the server closed while it was idle is found
        before any byte of the next request goes out on it."""
        assert self.transport is not None
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return False
        poll = select.poll()  # not select.select: a relay's descriptors may pass FD_SETSIZE
        poll.register(sock.fileno(), select.POLLIN)
        return not poll.poll(0)

    def send(self, request: bytes) -> asyncio.Future[Answer]:
        assert self.transport is not None
        self.reusable = False
        self.answer = asyncio.get_running_loop().create_future()
        self._over = False
        self.received = self._status = self._head_bytes = self._field_bytes = 0
        self._body = bytearray()
        self._headers_done = self._framed = False
        self.transport.write(request)
        return self.answer

    def finish(self) -> None:
        """After the exchange: keep the connection only if its answer allowed it."""
        self.answer = None
        if not self.usable():  # stray bytes may have closed it already
            self.close()

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()

    # -- asyncio.Protocol -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._over:
            # Nobody asked: a second answer, or stray bytes, would be read as the next event's.
            self.close()
            return
        before = self.received
        self.received += len(data)
        if before < 5 and not b"HTTP/"[before:].startswith(data[: 5 - before]):
            # llhttp also reads RTSP/ and ICE/ status lines; an HTTP server says HTTP/.
            self._fail(PostFailed(f"connection error: not an HTTP/1.1 answer: {data[:40]!r}"))
            return
        if not self._headers_done:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if not self._over:
                cause = exc.__context__ if isinstance(exc.__context__, _Refused) else exc
                self._fail(PostFailed(f"connection error: a malformed answer: {cause}"))
            # else: garbage after a complete answer, which stands; the connection is not kept.
            self.reusable = False
            return
        if self._over:
            return
        if len(self._body) >= RESPONSE_BODY_LIMIT_BYTES:
            # The start of the body is all the error text needs; the rest is not read, so the
            # connection cannot be reused.
            self._answered(reusable=False)
        elif not self._headers_done and self._head_bytes > _HEAD_LIMIT_BYTES:
            self._fail(
                PostFailed(f"connection error: answer headers over {_HEAD_LIMIT_BYTES} bytes")
            )

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        if self._over:
            return
        if self._headers_done and not self._framed:  # a body that runs to the close ends here
            self._answered(reusable=False)
        elif exc is not None:
            self._fail(PostFailed(f"connection error: {type(exc).__name__}: {exc}"))
        else:
            self._fail(PostFailed("connection error: the server closed the connection"))

    def _answered(self, *, reusable: bool) -> None:
        self._over = True
        self.reusable = reusable
        if self.answer is not None and not self.answer.done():  # not cancelled by the timeout
            body = bytes(self._body[:RESPONSE_BODY_LIMIT_BYTES])
            self.answer.set_result(Answer(self._status, body))

    def _fail(self, exc: Exception) -> None:
        self._over = True
        self.reusable = False
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(exc)

    # -- llhttp's callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._over:  # a second answer in the same read: stray bytes
            self.reusable = False
            return
        self._framed = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._over:
            return
        size = len(name)
        self._field_bytes += size + len(value) + 4
        # Only the framing fields matter here (llhttp enforces their rules); their lengths are
        # compared first, as most fields are neither.
        if size == 14 and name.lower() == b"content-length":
            self._framed = True
        elif (
            size == 17
            and name.lower() == b"transfer-encoding"
            and value.rsplit(b",", 1)[-1].strip().lower() == b"chunked"
        ):
            self._framed = True

    def on_headers_complete(self) -> None:
        if self._over:
            return
        if self._field_bytes > _HEAD_LIMIT_BYTES:
            raise _Refused(f"answer headers over {_HEAD_LIMIT_BYTES} bytes")
        version = self._parser.get_http_version()
        if version != "1.1" and version != "1.0":
            raise _Refused(f"not an HTTP/1.1 answer (HTTP/{version})")
        self._status = self._parser.get_status_code()
        if self._status == 101:
            raise _Refused("the server switched protocols")
        self._headers_done = self._status >= 200  # an interim answer's head is not the answer's

    def on_body(self, body: bytes) -> None:
        if not self._over and len(self._body) < RESPONSE_BODY_LIMIT_BYTES:
            self._body += body

    def on_message_complete(self) -> None:
        if self._over:
            return
        if self._status < 200:  # 100 Continue, 103 Early Hints: the answer follows
            self._head_bytes = self._field_bytes = 0
            return
        # Read now: llhttp's view of keep-alive (HTTP/1.0, `Connection: close`, a body that ran
        # to the close) belongs to this message, not to whatever bytes follow it.
        self._answered(reusable=self._parser.should_keep_alive())


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
            connection = self._kept(key) or await self._dial(key)
            return await self._exchange(key, connection, request)

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
            if (
                now - connection.returned_at < IDLE_SECONDS
                and connection.usable()
                and connection.quiet()
            ):
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
        loop = asyncio.get_running_loop()

        async def connect(address: str) -> _Connection:
            _, connection = await loop.create_connection(
                _Connection,
                address,
                port,
                ssl=self._ssl if tls else None,
                server_hostname=host if tls else None,
                # A name the guard does not vet (the trusted poster's): asyncio resolves it and
                # races its addresses itself, the same way.
                happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY_SECONDS,
                interleave=1,
            )
            return connection

        addresses = await self._addresses(host, port)
        try:
            if len(addresses) == 1:
                return await connect(addresses[0])
            won, _, failures = await staggered_race(
                [partial(connect, address) for address in _interleaved(addresses)],
                HAPPY_EYEBALLS_DELAY_SECONDS,
            )
        except OSError as exc:  # refused, unreachable, TLS handshake or certificate
            raise PostFailed(f"connection error: cannot connect to {host}:{port}: {exc}") from None
        connection: _Connection | None = won
        if connection is None:  # every address failed: the last reason says enough
            failure = next((f for f in reversed(failures) if f is not None), None)
            raise PostFailed(f"connection error: cannot connect to {host}:{port}: {failure}")
        return connection

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
        return list(dict.fromkeys(v["host"] for v in vetted))

    # -- one exchange ---------------------------------------------------------------------------

    async def _exchange(
        self, key: tuple[str, str, int], connection: _Connection, request: bytes
    ) -> Answer:
        try:
            result = await connection.send(request)
        except BaseException:  # no answer, the timeout, a cancellation
            connection.close()
            raise
        connection.finish()
        if connection.reusable:
            connection.returned_at = time.monotonic()
            self._idle.setdefault(key, []).append(connection)
        return result


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


def _interleaved(addresses: list[str]) -> list[str]:
    """The resolver's order, families alternating from the first one's (RFC 8305 section 4)."""
    first_v6 = ":" in addresses[0]
    same = [a for a in addresses if (":" in a) == first_v6]
    other = [a for a in addresses if (":" in a) != first_v6]
    mixed: list[str] = []
    for i in range(max(len(same), len(other))):
        mixed.extend(group[i] for group in (same, other) if i < len(group))
    return mixed
