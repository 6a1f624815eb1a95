"""A cheap HTTP/1.1 load generator for the ingest benchmark: raw asyncio, keep-alive, requests
built before the clock starts.

aiohttp's client costs a few hundred microseconds of CPU per request; at thousands of requests a
second on a 2-core machine it would compete with the API it measures, and the figure would be the
client's. This client writes prepared bytes and reads just the status line, the headers up to
`Content-Length` and the body: tens of microseconds per request. Its own CPU is measured
(`time.process_time` of this process, which does nothing else meanwhile) and reported beside the
API's and PostgreSQL's, so a reader can see it was not the bottleneck.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class LoadResult:
    statuses: dict[int, int] = field(default_factory=dict)
    times: list[float] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    seconds: float = 0.0
    client_cpu_seconds: float = 0.0


def request_bytes(
    method: str, path: str, body: bytes, headers: dict[str, str] | None = None
) -> bytes:
    """One HTTP/1.1 request with a JSON body, ready to write."""
    lines = [
        f"{method} {path} HTTP/1.1",
        "Host: bench",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
            break
    body = await reader.readexactly(length) if length else b""
    return status, body


async def run_load(
    host: str,
    port: int,
    requests: Sequence[bytes],
    *,
    clients: int,
    keep_bodies: bool = False,
    on_response: Callable[[int], None] | None = None,
) -> LoadResult:
    """Send `requests` over `clients` keep-alive connections, each one request at a time."""
    result = LoadResult()
    statuses = result.statuses
    times = result.times
    next_index = iter(range(len(requests)))

    async def client() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            for i in next_index:
                t0 = time.perf_counter()
                writer.write(requests[i])
                status, body = await _read_response(reader)
                times.append(time.perf_counter() - t0)
                statuses[status] = statuses.get(status, 0) + 1
                if keep_bodies:
                    result.bodies.append(body)
                if on_response is not None:
                    on_response(status)
        finally:
            writer.close()

    cpu0 = time.process_time()
    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    result.seconds = time.perf_counter() - t0
    result.client_cpu_seconds = time.process_time() - cpu0
    return result
