"""Hostile and broken requests against the API process, over raw sockets.

Oversized bodies (declared and streamed without a length), malformed and deeply nested JSON,
wrong content types, huge headers, and slow clients that dribble their headers or body. Each is
answered with a 4xx (or the connection is closed) and never with a 5xx; the API's memory stays
bounded however much is thrown at it; requests from ordinary clients keep being answered while
slow clients hold connections open; and a worker running beside it keeps delivering (nothing
hostile reaches the queue, so nothing can wedge a worker).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import aiohttp

from notify_queue.repositories.db import Database
from tests.chaos.harness import poll, read_rows, record, worker_flags
from tests.support import free_port

MAX_BODY = 2 * 1024 * 1024  # the API's default --max-body-bytes


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def _raw(
    port: int,
    head: bytes,
    body_chunks: list[bytes] = (),
    *,
    pause: float = 0.0,  # type: ignore[assignment]
    timeout: float = 20,
) -> int:
    """Send a request as bytes; return the response status, or 0 if the server closed first."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        for chunk in body_chunks:
            writer.write(chunk)
            try:
                await writer.drain()
            except ConnectionError:
                break
            if pause:
                await asyncio.sleep(pause)
        line = await asyncio.wait_for(reader.readline(), timeout)
        return int(line.split()[1]) if line.startswith(b"HTTP/1.1") else 0
    except (ConnectionError, asyncio.IncompleteReadError):
        return 0
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except ConnectionError:
            pass


async def _dribble(port: int, start: bytes) -> None:
    """A slow client: `start`, then one byte every 0.2 s, never finishing the request."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(start)
        while True:
            await asyncio.sleep(0.2)
            writer.write(b"a")
            await writer.drain()
    except ConnectionError:
        return
    finally:
        writer.close()


def _head(
    path: str,
    *,
    content_type: str = "application/json",
    length: int | None = None,
    extra: str = "",
    chunked: bool = False,
) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Type: {content_type}"]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    elif length is not None:
        lines.append(f"Content-Length: {length}")
    if extra:
        lines.append(extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _valid(key: str) -> bytes:
    return json.dumps(
        {"channel": "email", "recipient": f"{key}@example.com", "body": "hi", "idempotencyKey": key}
    ).encode()


async def test_hostile_requests_are_refused_without_memory_growth_or_a_stuck_api_or_worker(
    db: Database, database_url: str, spawn
) -> None:
    port = free_port()
    procs = spawn(database_url, *worker_flags(None, None))
    api = procs.start_api(port)
    worker = procs.start()
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        await poll(lambda: _ok(http, f"{base}/readyz"), timeout=30, what="API ready")
        baseline = _rss_mib(api.pid)
        answers: dict[str, list[int]] = {}

        def note(name: str, status: int) -> None:
            answers.setdefault(name, []).append(status)

        # A body declared far over the limit is refused before it is read.
        for _ in range(5):
            note(
                "declared 1 GiB",
                await _raw(port, _head("/notifications", length=1 << 30), [b"{" * 1024]),
            )
        # A body without a length, streamed past the limit, is cut off at the limit.
        for _ in range(3):
            chunks = [_chunk(b" " * 65536) for _ in range((4 * MAX_BODY) // 65536)] + [b"0\r\n\r\n"]
            note(
                "streamed 8 MiB",
                await _raw(port, _head("/notifications/batch", chunked=True), chunks),
            )
        # Just under the limit but a single huge string: rejected as a field, not a crash.
        big = json.dumps(
            {"channel": "email", "recipient": "a@example.com", "body": "x" * (MAX_BODY - 200)}
        ).encode()
        note(
            "body field too large",
            await _raw(port, _head("/notifications", length=len(big)), [big]),
        )
        nested = b"[" * 100_000 + b"]" * 100_000
        note(
            "100k-deep JSON",
            await _raw(port, _head("/notifications", length=len(nested)), [nested]),
        )
        wide = json.dumps({"notifications": [{"x": i} for i in range(20_000)]}).encode()
        note(
            "20k invalid batch items",
            await _raw(port, _head("/notifications/batch", length=len(wide)), [wide]),
        )
        for name, data in {
            "malformed JSON": b'{"channel": "email", ',
            "not UTF-8": b'{"body": "\xff\xfe"}',
            "NUL in a field": json.dumps(
                {"channel": "email", "recipient": "a@example.com", "body": "a\u0000b"}
            ).encode(),
            "NaN": b'{"channel": "email", "recipient": "a@example.com", "body": "b",'
            b' "delaySeconds": NaN}',
            "huge number": b'{"delaySeconds": 1' + b"0" * 5000 + b"}",
            "unknown field": b'{"channel": "email", "recipient": "a@example.com", "body": "b",'
            b' "admin": true}',
            "array body": b"[]",
            "empty body": b"",
        }.items():
            note(name, await _raw(port, _head("/notifications", length=len(data)), [data]))
        for content_type in (
            "text/plain",
            "application/x-www-form-urlencoded",
            "application/json; charset=latin-1",
            "multipart/form-data; boundary=x",
        ):
            data = _valid(f"ct-{uuid.uuid4().hex}")
            note(
                f"content type {content_type}",
                await _raw(
                    port,
                    _head("/notifications", content_type=content_type, length=len(data)),
                    [data],
                ),
            )
        note(
            "64 KiB header",
            await _raw(
                port, _head("/notifications", length=2, extra="X-Big: " + "a" * 65536), [b"{}"]
            ),
        )
        many = "\r\n".join(f"X-H{i}: v" for i in range(5000))
        note(
            "5000 headers", await _raw(port, _head("/notifications", length=2, extra=many), [b"{}"])
        )
        note(
            "bad Content-Length",
            await _raw(port, _head("/notifications", extra="Content-Length: -5"), [b"{}"]),
        )

        # Slow clients: 40 connections dribbling headers, 10 dribbling a body, all at once, while an
        # ordinary client keeps creating notifications: each must be answered while they hold on.
        data = _valid("slow-body")
        dribblers = [
            asyncio.create_task(_dribble(port, b"POST /notifications HTTP/1.1\r\nX-Slow: a"))
            for _ in range(40)
        ]
        dribblers += [
            asyncio.create_task(
                _dribble(port, _head("/notifications", length=len(data)) + data[:5])
            )
            for _ in range(10)
        ]
        await asyncio.sleep(1.0)
        served = []
        for i in range(10):
            started = time.monotonic()
            async with http.post(
                f"{base}/notifications",
                data=_valid(f"during-{i}-{uuid.uuid4().hex}"),
                headers={"Content-Type": "application/json"},
            ) as r:
                assert r.status == 201, await r.text()
                served.append(time.monotonic() - started)
        held_open = sum(1 for d in dribblers if not d.done())
        for d in dribblers:
            d.cancel()
        slow_results = await asyncio.gather(*dribblers, return_exceptions=True)
        peak = _rss_mib(api.pid)

        # Afterwards: the API answers, the worker delivers what was created.
        assert api.poll() is None and worker.poll() is None
        async with http.post(
            f"{base}/notifications",
            data=_valid(f"after-{uuid.uuid4().hex}"),
            headers={"Content-Type": "application/json"},
        ) as r:
            assert r.status == 201
    await poll(lambda: _all_sent(db, 11), timeout=30, what="the worker delivered everything valid")
    stored = await read_rows(db, "SELECT count(*) AS n FROM nq_all_notifications")

    everything = {name: statuses for name, statuses in answers.items()}
    record(
        "hostile input",
        {
            "answers": everything,
            "rss_baseline_mib": round(baseline),
            "rss_peak_mib": round(peak),
            "ordinary_request_worst_seconds": round(max(served), 3),
            "slow_clients": len(slow_results),
            "slow_clients_still_connected": held_open,
            "notifications_stored": stored[0]["n"],
        },
    )
    for name, statuses in everything.items():
        assert all(s == 0 or 400 <= s < 500 for s in statuses), (name, statuses)
    assert set(everything["declared 1 GiB"]) <= {413, 0} and set(everything["streamed 8 MiB"]) <= {
        413,
        0,
    }
    assert 413 in everything["declared 1 GiB"] + everything["streamed 8 MiB"]
    assert stored[0]["n"] == 11  # nothing hostile reached the queue
    assert peak - baseline < 100, f"the API grew by {peak - baseline:.0f} MiB"
    # Not blocked by slow clients: every ordinary request was answered while all of them still
    # held their connections (how quickly is recorded above, not asserted: a busy machine is slow).
    assert len(served) == 10 and held_open == len(dribblers), (len(served), held_open)


async def _ok(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url) as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


async def _all_sent(db: Database, n: int) -> bool:
    rows = await read_rows(
        db, "SELECT count(*) AS n FROM nq_all_notifications WHERE status = 'SENT'"
    )
    return rows[0]["n"] == n
