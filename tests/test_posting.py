"""The relay's HTTP client (`providers/posting.py`) against real sockets.

A raw asyncio server on loopback answers with exactly the bytes a test gives it, so every framing
an HTTP/1.1 server may use is exercised byte for byte: Content-Length, chunked with trailers, a
body that runs to the close, interim 1xx answers, garbage, oversized bodies and headers, silence.
It also records what arrived, on which connection, so keep-alive, and the rule that a POST once
written is never sent again (one attempt, at most one POST), are seen from the server's side.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from notify_queue.providers import posting
from notify_queue.providers.outbound import (
    RESPONSE_BODY_LIMIT_BYTES,
    OutboundRefused,
)
from notify_queue.providers.posting import Answer, PostFailed, guarded_poster, trusted_poster
from tests.support import missing_component
from tests.test_outbound_guard import FixedResolver

NO_CONTENT = b"HTTP/1.1 204 No Content\r\n\r\n"

# What the server does with the n-th request (from 0) on a connection: the bytes to answer, or
# None to close the connection without answering.
Script = Callable[[int, bytes], bytes | None]


class RawServer:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[tuple[int, bytes]] = []  # (connection number, request head + body)
        self.connections = 0
        self.closed_by_client = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    def url(self, host: str = "127.0.0.1", path: str = "/hooks") -> str:
        return f"http://{host}:{self.port}{path}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = self.connections
        self.connections += 1
        try:
            for n in range(1_000):
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError as exc:
                    self.closed_by_client += not exc.partial
                    raise
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                request = head + await reader.readexactly(length)
                self.requests.append((number, request))
                answer = self.script(n, request)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Script], Awaitable[RawServer]]]:
    servers: list[RawServer] = []

    async def start(script: Script) -> RawServer:
        server = RawServer(script)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        assert server.server is not None
        server.server.close()


async def _post(url: str, *, timeout: float = 5.0, body: bytes = b"{}") -> Answer:
    poster = trusted_poster(timeout_seconds=timeout)
    try:
        return await poster.post(url, body, {"webhook-id": "e-1"})
    finally:
        await poster.close()


async def test_posts_to_one_host_share_one_kept_connection(serve) -> None:
    server = await serve(lambda n, request: NO_CONTENT)
    poster = trusted_poster(timeout_seconds=5.0)
    for i in range(3):
        answer = await poster.post(server.url(), b'{"n":%d}' % i, {"webhook-id": f"e-{i}"})
        assert answer == Answer(204, b"")
    await poster.close()
    assert [connection for connection, _ in server.requests] == [0, 0, 0]
    first = server.requests[0][1]
    assert first.startswith(b"POST /hooks HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}\r\n".encode() in first
    assert b"webhook-id: e-0\r\n" in first and first.endswith(b'\r\n\r\n{"n":0}')


async def test_a_kept_connection_closed_after_reading_the_request_is_one_failed_post(
    serve,
) -> None:
    """The server reads the whole request and closes without answering: the POST reached it, so
    it is a failure (outcome unknown), never sent again on a new connection by the same call."""
    server = await serve(lambda n, request: NO_CONTENT if n == 0 else None)
    poster = trusted_poster(timeout_seconds=5.0)
    assert await poster.post(server.url(), b"{}", {"webhook-id": "e-0"}) == Answer(204, b"")
    with pytest.raises(PostFailed, match="closed the connection"):
        await poster.post(server.url(), b"{}", {"webhook-id": "e-1"})
    assert await poster.post(server.url(), b"{}", {"webhook-id": "e-2"}) == Answer(204, b"")
    await poster.close()
    # e-1 arrived once, on the kept connection; e-2 went out on a new one.
    assert [(c, webhook_id_of(r)) for c, r in server.requests] == [
        (0, "e-0"),
        (0, "e-1"),
        (1, "e-2"),
    ]


def webhook_id_of(request: bytes) -> str:
    head = request.split(b"\r\n\r\n", 1)[0].decode()
    return next(
        line.split(": ", 1)[1] for line in head.split("\r\n") if line.startswith("webhook-id")
    )


class ClosingAfterAnswerServer:
    """A blocking server in its own thread: answers each connection's first request, then closes
    that connection. `closed` is set once the first connection is closed, so a test can block its
    event loop until then: the client's loop has not read the end of file yet when it POSTs."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/hooks"
        self.requests: list[tuple[int, bytes]] = []
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        for number in range(2):
            conn, _ = self.listener.accept()
            with conn:
                data = b""
                while b"\r\n\r\n{}" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                self.requests.append((number, data))
                conn.sendall(NO_CONTENT)
            self.closed.set()

    def stop(self) -> None:
        self.listener.close()
        self.thread.join(5.0)


async def test_a_kept_connection_the_server_closed_while_idle_is_not_written_to() -> None:
    """The server closes an idle kept connection just before the next POST: the client finds it
    closed before writing, and sends the POST once, on a new connection, without a failure."""
    server = ClosingAfterAnswerServer()
    poster = trusted_poster(timeout_seconds=5.0)
    try:
        assert await poster.post(server.url, b"{}", {"webhook-id": "e-0"}) == Answer(204, b"")
        # Blocks the loop on purpose: the end of file waits, unread, on the kept connection.
        assert server.closed.wait(5.0)
        assert await poster.post(server.url, b"{}", {"webhook-id": "e-1"}) == Answer(204, b"")
    finally:
        await poster.close()
        server.stop()
    assert [(c, webhook_id_of(r)) for c, r in server.requests] == [(0, "e-0"), (1, "e-1")]


async def test_connections_idle_too_long_are_closed_for_every_host(
    serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(posting, "IDLE_SECONDS", 0.2)
    first = await serve(lambda n, request: NO_CONTENT)
    second = await serve(lambda n, request: NO_CONTENT)
    poster = trusted_poster(timeout_seconds=5.0)
    await poster.post(first.url(), b"{}", {})
    await asyncio.sleep(0.4)
    await poster.post(second.url(), b"{}", {})  # a POST to another host sweeps the first's
    await asyncio.sleep(0.1)
    assert first.closed_by_client == 1 and second.closed_by_client == 0
    await poster.close()


async def test_a_new_connection_closed_without_an_answer_is_a_failure_not_a_loop(serve) -> None:
    server = await serve(lambda n, request: None)
    with pytest.raises(PostFailed, match="closed the connection"):
        await _post(server.url())
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("answer", "expected", "reused"),
    [
        (
            b"HTTP/1.1 503 Busy\r\nContent-Length: 9\r\n\r\nno thanks",
            Answer(503, b"no thanks"),
            True,
        ),
        (
            b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n",
            Answer(500, b"hello world"),
            True,
        ),
        (b"HTTP/1.1 100 Continue\r\n\r\n" + NO_CONTENT, Answer(204, b""), True),
        (
            b"HTTP/1.1 302 Found\r\nLocation: http://169.254.169.254/\r\nContent-Length: 0\r\n\r\n",
            Answer(302, b""),
            True,
        ),
        (
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
            Answer(200, b"ok"),
            False,
        ),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", Answer(200, b"ok"), False),
    ],
    ids=[
        "content-length",
        "chunked",
        "interim-100",
        "redirect-not-followed",
        "connection-close",
        "http-1.0",
    ],
)
async def test_each_answer_framing_is_read_and_the_connection_kept_only_when_it_can_be(
    serve, answer: bytes, expected: Answer, reused: bool
) -> None:
    server = await serve(lambda n, request: answer)
    poster = trusted_poster(timeout_seconds=5.0)
    assert await poster.post(server.url(), b"{}", {}) == expected
    assert await poster.post(server.url(), b"{}", {}) == expected
    await poster.close()
    assert [c for c, _ in server.requests] == ([0, 0] if reused else [0, 1])


async def test_a_body_that_runs_to_the_close_is_read_and_the_connection_not_kept() -> None:
    connections = 0

    async def answer_and_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 502 Bad Gateway\r\n\r\nupstream down")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer_and_close, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
    poster = trusted_poster(timeout_seconds=5.0)
    assert await poster.post(url, b"", {}) == Answer(502, b"upstream down")
    assert await poster.post(url, b"", {}) == Answer(502, b"upstream down")
    await poster.close()
    server.close()
    assert connections == 2


async def test_an_oversized_body_is_cut_at_the_limit_and_its_connection_closed(serve) -> None:
    big = b"x" * (1024 * 1024)
    server = await serve(
        lambda n, request: b"HTTP/1.1 500 Big\r\nContent-Length: %d\r\n\r\n" % len(big) + big
    )
    poster = trusted_poster(timeout_seconds=5.0)
    first = await poster.post(server.url(), b"{}", {})
    second = await poster.post(server.url(), b"{}", {})
    await poster.close()
    assert first == second == Answer(500, b"x" * RESPONSE_BODY_LIMIT_BYTES)
    assert [c for c, _ in server.requests] == [0, 1]


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "not an HTTP/1.1 answer"),
        (b"HTTP/1.1 abc Nope\r\n\r\n", "malformed answer: Invalid status code"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size"),
        (b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", "answer headers over"),
        (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", "switched protocols"),
    ],
    ids=["not-http", "bad-status", "bad-length", "bad-chunk", "huge-headers", "upgrade"],
)
async def test_an_answer_that_is_not_http_is_a_connection_error(
    serve, answer: bytes, message: str
) -> None:
    server = await serve(lambda n, request: answer)
    with pytest.raises(PostFailed, match=message):
        await _post(server.url())


OWN_ANSWER = b"HTTP/1.1 202 Accepted\r\nContent-Length: 3\r\n\r\nown"


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
            "Duplicate Content-Length",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok",
            "Duplicate Content-Length",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\nok", "Content-Length"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"2\r\nok\r\n0\r\n\r\n",
            "Transfer-Encoding can't be present with Content-Length",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok", "Content-Length"),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: \u0662\r\n\r\nok".encode(),
            "Invalid character in Content-Length",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\nok",
            "Content-Length overflow",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-2\r\nok\r\n0\r\n\r\n",
            "Invalid character in chunk size",
        ),
        (
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            "\u0662\r\nok\r\n0\r\n\r\n".encode(),
            "Invalid character in chunk size",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"fffffffffffffffffffff\r\nok\r\n0\r\n\r\n",
            "Chunk size overflow",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1_0\r\nok\r\n0\r\n\r\n",
            "Invalid character in chunk size",
        ),
        (b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok", "Missing expected CR"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX: a\r\n b\r\n\r\nok", "whitespace"),
        (b"HTTP/2.0 200 OK\r\nContent-Length: 2\r\n\r\nok", "not an HTTP/1.1 answer"),
        (b"RTSP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", "not an HTTP/1.1 answer"),
    ],
    ids=[
        "duplicate-content-length-differing",
        "duplicate-content-length-equal",
        "content-length-list",
        "content-length-with-transfer-encoding",
        "content-length-signed",
        "content-length-non-ascii-digit",
        "content-length-overflow",
        "chunk-size-negative",
        "chunk-size-non-ascii-digit",
        "chunk-size-overflow",
        "chunk-size-underscore",
        "bare-lf",
        "obsolete-line-folding",
        "http-2-status-line",
        "rtsp-status-line",
    ],
)
async def test_malformed_framing_is_a_failed_post_with_its_reason_and_the_connection_dropped(
    serve, answer: bytes, reason: str
) -> None:
    """RFC 9112 sections 6.1-6.3 and 7.1, as llhttp reads them: each of these answers fails
    the POST (a failed attempt, never an exception the relay does not expect), and the next POST
    goes out on a new connection and gets its own answer."""
    server = await serve(lambda n, request: answer if len(server.requests) == 1 else OWN_ANSWER)
    poster = trusted_poster(timeout_seconds=5.0)
    with pytest.raises(PostFailed, match=f"connection error: .*{reason}"):
        await poster.post(server.url(), b"{}", {"webhook-id": "e-1"})
    assert await poster.post(server.url(), b"{}", {"webhook-id": "e-2"}) == Answer(202, b"own")
    await poster.close()
    assert [c for c, _ in server.requests] == [0, 1]


@pytest.mark.parametrize(
    "stray",
    [b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", b"garbage", b"HTTP/1.1 2"],
    ids=["a-whole-second-answer", "garbage", "the-start-of-an-answer"],
)
async def test_bytes_after_a_complete_answer_close_the_connection_and_the_next_post_gets_its_own(
    serve, stray: bytes
) -> None:
    """The receiver refuses the first event and sends more than its answer in the same write. The
    old client left those bytes in the kept connection and read them as the next event's answer
    (a 200: an event credited with an answer it never had)."""
    refused = b"HTTP/1.1 500 Refused\r\nContent-Length: 2\r\n\r\nno" + stray
    server = await serve(lambda n, request: refused if len(server.requests) == 1 else OWN_ANSWER)
    poster = trusted_poster(timeout_seconds=5.0)
    assert await poster.post(server.url(), b"{}", {"webhook-id": "e-1"}) == Answer(500, b"no")
    assert await poster.post(server.url(), b"{}", {"webhook-id": "e-2"}) == Answer(202, b"own")
    await poster.close()
    assert [c for c, _ in server.requests] == [0, 1]


async def test_junk_on_a_kept_connection_is_a_failure_not_a_resend(serve) -> None:
    """A kept connection that answered junk had its POST reach the server: a failure, no resend."""
    server = await serve(lambda n, request: NO_CONTENT if n == 0 else b"SSH-2.0-x\r\n\r\n")
    poster = trusted_poster(timeout_seconds=5.0)
    assert await poster.post(server.url(), b"{}", {}) == Answer(204, b"")
    with pytest.raises(PostFailed, match=r"not an HTTP/1\.1 answer"):
        await poster.post(server.url(), b"{}", {})
    await poster.close()
    assert [c for c, _ in server.requests] == [0, 0]


async def test_bytes_arriving_on_an_idle_connection_close_it() -> None:
    """Stray bytes sent a moment after the answer, while the connection waits in the pool: the
    next POST does not read them; it goes out on a new connection."""
    connections = 0
    sent_late = asyncio.Event()

    async def answer_then_stray(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        first = connections == 1
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(2)
                if first:
                    writer.write(b"HTTP/1.1 500 Refused\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
                    await asyncio.sleep(0.1)
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    sent_late.set()
                    first = False
                else:
                    writer.write(OWN_ANSWER)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(answer_then_stray, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
    poster = trusted_poster(timeout_seconds=5.0)
    assert await poster.post(url, b"{}", {}) == Answer(500, b"")
    await asyncio.wait_for(sent_late.wait(), 5.0)
    await asyncio.sleep(0.1)  # the stray answer reaches the client's idle connection
    assert await poster.post(url, b"{}", {}) == Answer(202, b"own")
    await poster.close()
    server.close()
    assert connections == 2


async def test_a_late_answer_never_reaches_the_next_post() -> None:
    """The first answer comes after the timeout: that connection is closed, not kept, so the next
    POST gets its own answer rather than the late one still on the wire."""
    connections = 0

    async def slow_then_quick(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        late = connections == 1
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(2)
                if late:
                    await asyncio.sleep(0.5)
                    writer.write(b"HTTP/1.1 500 Late\r\nContent-Length: 4\r\n\r\nlate")
                    late = False
                else:
                    writer.write(NO_CONTENT)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(slow_then_quick, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
    poster = trusted_poster(timeout_seconds=0.3)
    with pytest.raises(TimeoutError):
        await poster.post(url, b"{}", {})
    await asyncio.sleep(0.6)  # the late answer has arrived on the first connection by now
    assert await poster.post(url, b"{}", {}) == Answer(204, b"")
    await poster.close()
    server.close()
    assert connections == 2


async def test_nothing_listening_is_a_connection_error(serve) -> None:
    server = await serve(lambda n, request: NO_CONTENT)
    url = server.url()
    assert server.server is not None
    server.server.close()
    await server.server.wait_closed()
    with pytest.raises(PostFailed, match="cannot connect"):
        await _post(url)


async def test_a_header_with_a_line_break_is_refused_before_sending(serve) -> None:
    server = await serve(lambda n, request: NO_CONTENT)
    poster = trusted_poster(timeout_seconds=5.0)
    with pytest.raises(PostFailed, match="line break"):
        await poster.post(server.url(), b"{}", {"webhook-id": "e\r\nX-Injected: 1"})
    await poster.close()
    assert server.requests == []


async def test_a_line_break_in_a_urls_path_or_query_starts_no_header(serve) -> None:
    """A client's webhookUrl goes into the request line: the URL parser drops CR and LF (WHATWG
    URL rules) and escapes the other control characters, so no header can start there."""
    server = await serve(lambda n, request: NO_CONTENT)
    url = server.url(path="/hooks\r\nX-Injected: 1?q=\r\nX-Injected: 2&c=\x01")
    assert await _post(url) == Answer(204, b"")
    [(_, request)] = server.requests
    head = request.split(b"\r\n\r\n", 1)[0]
    assert b"X-Injected" not in head.split(b"\r\n", 1)[1]
    assert head.split(b"\r\n", 1)[0] == (
        b"POST /hooksX-Injected:%201?q=X-Injected:+2&c=%01 HTTP/1.1"
    )


@pytest.mark.parametrize(
    "url", ["ftp://hooks.example/x", "http:///no-host", "http://user:s3cret@hooks.example:99999/"]
)
async def test_a_url_that_cannot_be_posted_to_fails_without_repeating_it(url: str) -> None:
    with pytest.raises(PostFailed, match="cannot POST to this URL") as failed:
        await _post(url)
    assert "s3cret" not in str(failed.value)


# --- the outbound guard -----------------------------------------------------------------------


async def test_a_literal_internal_address_is_refused_before_any_connection(serve) -> None:
    server = await serve(lambda n, request: NO_CONTENT)
    poster = guarded_poster(allow=[], timeout_seconds=5.0)
    with pytest.raises(OutboundRefused, match="loopback"):
        await poster.post(server.url(), b"{}", {})
    await poster.close()
    assert server.connections == 0


async def test_a_name_is_dialled_at_its_vetted_address_and_sent_with_its_own_host(serve) -> None:
    server = await serve(lambda n, request: NO_CONTENT)
    table = {"hooks.example": ["127.0.0.1"]}
    poster = guarded_poster(
        allow=["127.0.0.1/32"],
        timeout_seconds=5.0,
        resolver=FixedResolver(table),
    )
    assert await poster.post(server.url("hooks.example"), b"{}", {}) == Answer(204, b"")
    # The name moves inside; within the verdict's TTL the vetted address is still what is dialled.
    table["hooks.example"] = ["10.0.0.5"]
    await poster.close()
    assert f"Host: hooks.example:{server.port}\r\n".encode() in server.requests[0][1]


async def test_a_name_pointing_inside_is_refused_before_any_connection(serve) -> None:
    server = await serve(lambda n, request: NO_CONTENT)
    poster = guarded_poster(
        allow=[],
        timeout_seconds=5.0,
        resolver=FixedResolver({"inside.example": ["127.0.0.1"]}),
    )
    with pytest.raises(OutboundRefused, match=r"'inside\.example'.*loopback"):
        await poster.post(server.url("inside.example"), b"{}", {})
    await poster.close()
    assert server.connections == 0


# --- happy eyeballs ----------------------------------------------------------------------------


def _silent_ipv6_port() -> tuple[socket.socket, list[socket.socket], int]:
    """A port on ::1 where SYNs go unanswered, as on a route that drops IPv6: a listening socket
    with a backlog of one, filled. (A socket that listens but never accepts would not do: the
    kernel completes handshakes for it.) Returns the sockets to close and the port, free on
    127.0.0.1 as well."""
    for _ in range(20):
        silent = socket.socket(socket.AF_INET6)
        silent.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        silent.bind(("::1", 0))
        silent.listen(0)
        port = silent.getsockname()[1]
        probe = socket.socket(socket.AF_INET)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            silent.close()
            continue
        finally:
            probe.close()
        filler = socket.socket(socket.AF_INET6)
        filler.connect(("::1", port))  # the one the backlog holds; the next SYN is dropped
        return silent, [filler], port
    pytest.skip("no port free on both ::1 and 127.0.0.1")


async def test_a_name_whose_ipv6_address_drops_packets_is_reached_over_ipv4() -> None:
    """RFC 8305: the vetted IPv6 address comes first and never answers; the IPv4 attempt starts
    250 ms later and wins, well inside a timeout the IPv6 attempt alone would use up (the old
    client tried the addresses one after the other and timed out)."""
    silent, fillers, port = _silent_ipv6_port()
    arrived: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        arrived.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(NO_CONTENT)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", port)
    poster = guarded_poster(
        allow=["127.0.0.1/32", "::1/128"],
        timeout_seconds=10.0,
        resolver=FixedResolver({"dual.example": ["::1", "127.0.0.1"]}),
    )
    try:
        answer_ = await poster.post(f"http://dual.example:{port}/hooks", b"{}", {})
    finally:
        await poster.close()
        server.close()
        for sock in (silent, *fillers):
            sock.close()
    assert answer_ == Answer(204, b"")
    assert len(arrived) == 1 and arrived[0].startswith(b"POST /hooks HTTP/1.1\r\n")


def test_addresses_alternate_families_from_the_first_ones() -> None:
    assert posting._interleaved(["::1", "::2", "10.0.0.1", "10.0.0.2", "10.0.0.3"]) == [
        "::1",
        "10.0.0.1",
        "::2",
        "10.0.0.2",
        "10.0.0.3",
    ]
    assert posting._interleaved(["10.0.0.1", "::1"]) == ["10.0.0.1", "::1"]


# --- TLS --------------------------------------------------------------------------------------


def _certificate(tmp_path: Path, name: str) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        missing_component("openssl", "the openssl command makes the test certificate")
    cert, key = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", f"/CN={name}"),
            *("-addext", f"subjectAltName=DNS:{name}"),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def _tls_server(cert: Path, key: Path) -> tuple[asyncio.Server, list[bytes]]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    received: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            received.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(NO_CONTENT)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0, ssl=context), received


@pytest.mark.parametrize("served_name", ["hooks.example", "other.example"])
async def test_tls_is_verified_against_the_urls_host_while_the_vetted_address_is_dialled(
    tmp_path: Path, served_name: str
) -> None:
    cert, key = _certificate(tmp_path, served_name)
    server, received = await _tls_server(cert, key)
    port = server.sockets[0].getsockname()[1]
    poster = guarded_poster(
        allow=["127.0.0.1/32"],
        timeout_seconds=5.0,
        resolver=FixedResolver({"hooks.example": ["127.0.0.1"]}),
        ssl_context=ssl.create_default_context(cafile=str(cert)),
    )
    url = f"https://hooks.example:{port}/hooks"
    try:
        if served_name == "hooks.example":
            assert await poster.post(url, b"{}", {}) == Answer(204, b"")
            assert received[0].startswith(b"POST /hooks HTTP/1.1\r\n")
        else:  # the certificate names another host: nothing is sent
            with pytest.raises(PostFailed, match="CERTIFICATE_VERIFY_FAILED"):
                await poster.post(url, b"{}", {})
            assert received == []
    finally:
        await poster.close()
        server.close()
