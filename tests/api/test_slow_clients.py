"""Slow and vanishing clients against a real `notify-queue api` process.

A slowloris client sends its header block, or its body, a byte at a time and never finishes;
the server closes such a connection once its bound (`--header-timeout-seconds`,
`--body-timeout-seconds`) has passed, answering 408 problem+json. A header block past
`--max-header-bytes` is answered 431. A client that hangs up halfway through its body costs
one log line, never a traceback. The clients here are raw sockets: an HTTP client library would
not send half a request.

The bounds are 1 s here; each client keeps dripping for far longer (`DRIPS` bytes, one every
`DRIP_SECONDS`), so "closed within the bound" reads as "closed long before the client was done",
which holds however slow the machine: no assertion compares a time.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support import eventually, running_api

DRIP_SECONDS = 0.2
DRIPS = 150  # 30 s of dripping against a 1 s bound


@pytest.fixture
async def api(database_url: str, tmp_path: Path) -> AsyncIterator[tuple[str, int, Path]]:
    log = tmp_path / "api.log"
    async with running_api(
        database_url,
        log,
        "--header-timeout-seconds",
        "1",
        "--body-timeout-seconds",
        "1",
        "--max-header-bytes",
        "4096",
        log_level="INFO",
    ) as url:
        parts = urlsplit(url)
        assert parts.hostname is not None and parts.port is not None
        yield parts.hostname, parts.port, log


async def drip(host: str, port: int, head: bytes, drops: bytes) -> tuple[int, bytes]:
    """Send `head`, then `drops` a byte at a time until the server closes the connection:
    how many bytes of `drops` were sent, and what the server answered."""
    return await drip_on(*await asyncio.open_connection(host, port), head, drops)


async def drip_on(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes, drops: bytes
) -> tuple[int, bytes]:
    """`drip` on a connection already open."""
    answer = asyncio.create_task(reader.read())  # to the end: the server's close
    sent = 0
    try:
        writer.write(head)
        await writer.drain()
        for byte in drops:
            done, _ = await asyncio.wait([answer], timeout=DRIP_SECONDS)
            if done:
                break
            writer.write(bytes([byte]))
            try:
                await writer.drain()
            except ConnectionError:
                break
            sent += 1
        return sent, await asyncio.wait_for(answer, timeout=60)
    finally:
        writer.close()


def _problem(answer: bytes, status: int) -> dict[str, object]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), answer[:200]
    assert b"content-type: application/problem+json" in head.lower()
    document: dict[str, object] = json.loads(body)
    assert document["status"] == status
    return document


async def test_a_header_block_sent_a_byte_at_a_time_is_closed_with_408(
    api: tuple[str, int, Path],
) -> None:
    host, port, log = api
    head = b"POST /notifications HTTP/1.1\r\nHost: x\r\n"
    sent, answer = await drip(host, port, head, b"X-Slow: " + b"a" * DRIPS)

    assert sent < DRIPS, "the server held the half-sent header block open"
    problem = _problem(answer, 408)
    assert problem["type"] == "urn:notify-queue:problem:request-timeout"
    assert "headers did not arrive within 1 s" in str(problem["detail"])
    assert "its request headers took over 1 s" in log.read_text()


async def test_a_body_sent_a_byte_at_a_time_is_answered_408_and_closed(
    api: tuple[str, int, Path],
) -> None:
    host, port, log = api
    body = json.dumps({"channel": "email", "recipient": "a@example.com", "body": "x" * DRIPS})
    head = (
        "POST /notifications HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Idempotency-Key: slow-body\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    sent, answer = await drip(host, port, head, body.encode())

    assert sent < len(body), "the server waited for the whole trickled body"
    problem = _problem(answer, 408)
    assert problem["detail"] == "the request body did not arrive within 1 s"
    assert "Traceback" not in log.read_text()


async def test_a_header_block_over_the_limit_is_answered_431(api: tuple[str, int, Path]) -> None:
    host, port, _ = api
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8192
    sent, answer = await drip(host, port, head, b"a" * DRIPS)

    assert sent < DRIPS
    assert _problem(answer, 431)["type"] == (
        "urn:notify-queue:problem:request-header-fields-too-large"
    )


async def test_a_client_that_hangs_up_halfway_through_its_body_is_one_log_line(
    api: tuple[str, int, Path],
) -> None:
    host, port, log = api
    head = (
        b"POST /notifications HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Idempotency-Key: gone\r\nContent-Length: 1000\r\n\r\n{"channel": '
    )
    _, writer = await asyncio.open_connection(host, port)
    writer.write(head)
    await writer.drain()
    await asyncio.sleep(DRIP_SECONDS)  # the request reaches the app before the client goes
    writer.close()
    await writer.wait_closed()

    async def logged() -> bool:
        return "the client went away before its body arrived" in log.read_text()

    await eventually(logged, timeout=30)
    text = log.read_text()
    assert "Traceback" not in text
    assert text.count("went away") == 1


async def test_the_next_request_on_a_kept_alive_connection_has_the_same_header_bound(
    api: tuple[str, int, Path],
) -> None:
    host, port, _ = api
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    length = re.search(rb"content-length: (\d+)", head.lower())
    assert length is not None
    await reader.readexactly(int(length[1]))

    # The same connection: its second request's headers come a byte at a time.
    second = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
    sent, answer = await drip_on(reader, writer, second, b"X-Slow: " + b"a" * DRIPS)

    assert sent < DRIPS
    assert _problem(answer, 408)["type"] == "urn:notify-queue:problem:request-timeout"
