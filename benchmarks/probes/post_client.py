"""What one webhook POST costs the sending process, by HTTP client.

    python -m benchmarks.probes.post_client [--posts N] [--concurrency C] [--rounds R]
                                            [--output-dir D]

The relay spends most of its CPU in aiohttp's client (docs/performance.md). This measures how
much of that a lean client could save before anyone writes one: the same signed-event-sized POSTs,
over keep-alive connections to the benchmark receiver (`benchmarks.receiver`, a process of its
own), once with an `aiohttp.ClientSession` set up as the relay's is (no redirects, the body read),
once with the relay's own client (`providers/posting.py`, a `trusted_poster`: its parser, timeout
and connection pool included), once with a bare HTTP/1.1 client on asyncio streams (a request
buffer, the status line and Content-Length read back). The bare client is a measuring stick, not a
candidate: it has no TLS, no chunked bodies, no outbound guard and no timeouts. Rounds rotate the
order of the three.

Prints client CPU µs per POST and POSTs per second for each, and writes `<timestamp>.json` and
`latest.json` to `--output-dir` (`benchmarks/results/post-client`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.env import machine_info
from notify_queue.providers.posting import trusted_poster

OUT = Path(__file__).resolve().parent.parent / "results" / "post-client"
PAYLOAD = json.dumps(
    {
        "type": "notification.sent",
        "timestamp": "2026-11-30T20:00:00.000Z",
        "data": {"id": str(uuid.uuid4()), "status": "SENT", "recipient": "a@example.com"},
    }
).encode()

Client = Callable[[int, int, int], Awaitable[None]]


async def with_aiohttp(port: int, posts: int, concurrency: int) -> None:
    url = f"http://127.0.0.1:{port}/hooks"
    slots = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(i: int) -> None:
            headers = {"Content-Type": "application/json", "webhook-id": str(i)}
            async with (
                slots,
                session.post(url, data=PAYLOAD, headers=headers, allow_redirects=False) as answer,
            ):
                await answer.read()
                assert answer.status == 204, answer.status

        await asyncio.gather(*(one(i) for i in range(posts)))


async def relay(port: int, posts: int, concurrency: int) -> None:
    url = f"http://127.0.0.1:{port}/hooks"
    slots = asyncio.Semaphore(concurrency)
    poster = trusted_poster(timeout_seconds=30.0)

    async def one(i: int) -> None:
        headers = {"Content-Type": "application/json", "webhook-id": str(i)}
        async with slots:
            answer = await poster.post(url, PAYLOAD, headers)
            assert answer.status == 204, answer.status

    try:
        await asyncio.gather(*(one(i) for i in range(posts)))
    finally:
        await poster.close()


async def bare(port: int, posts: int, concurrency: int) -> None:
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    slots = asyncio.Semaphore(concurrency)
    head = (
        b"POST /hooks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nwebhook-id: " % len(PAYLOAD)
    )

    async def one(i: int) -> None:
        async with slots:
            reader, writer = (
                idle.pop() if idle else await asyncio.open_connection("127.0.0.1", port)
            )
            writer.write(head + str(i).encode() + b"\r\n\r\n" + PAYLOAD)
            answer = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in answer.split(b"\r\n")[1:]:
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if length:
                await reader.readexactly(length)
            assert answer[9:12] == b"204", answer[:12]
            idle.append((reader, writer))

    await asyncio.gather(*(one(i) for i in range(posts)))
    for _, writer in idle:
        writer.close()


async def measure(posts: int, concurrency: int, rounds: int) -> dict[str, list[dict[str, float]]]:
    receiver = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.receiver"], stdout=subprocess.PIPE, text=True
    )
    assert receiver.stdout is not None
    port = int(receiver.stdout.readline().split()[-1])
    clients: dict[str, Client] = {"aiohttp": with_aiohttp, "relay": relay, "bare": bare}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in clients}
    try:
        for round_ in range(rounds):
            names = list(clients)
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                cpu, wall = time.process_time(), time.perf_counter()
                await clients[name](port, posts, concurrency)
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                runs[name].append(
                    {
                        "client_cpu_us_per_post": round(cpu / posts * 1e6, 1),
                        "posts_per_second": round(posts / wall, 1),
                    }
                )
                print(f"{name:8} round {round_ + 1}: {runs[name][-1]}", flush=True)
    finally:
        receiver.terminate()
        receiver.wait()
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--posts", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output-dir", type=Path, default=OUT)
    args = parser.parse_args()
    started = datetime.now(UTC)
    runs = asyncio.run(measure(args.posts, args.concurrency, args.rounds))
    summary = {
        name: min(r["client_cpu_us_per_post"] for r in results) for name, results in runs.items()
    }
    print(f"client CPU per POST, best round: {summary}")
    doc: dict[str, Any] = {
        "command": "python -m benchmarks.probes.post_client " + " ".join(sys.argv[1:]),
        "started_at": started.isoformat(),
        "machine": machine_info(),
        "params": {"posts": args.posts, "concurrency": args.concurrency, "rounds": args.rounds},
        "runs": runs,
        "best_client_cpu_us_per_post": summary,
    }
    args.output_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=1)
    (args.output_dir / f"{started:%Y%m%dT%H%M%SZ}.json").write_text(text)
    (args.output_dir / "latest.json").write_text(text)


if __name__ == "__main__":
    main()
