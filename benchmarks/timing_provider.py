"""A provider that only records when each request arrived, in a process of its own.

Rate-limit tests and the provider_limit benchmark measure the limit where requests arrive.
Recorded inside the test process, an arrival is stamped when that process's event loop gets to
it, so a pause there (garbage collection, reading 2,000 rows back) would stamp seconds of evenly
spaced requests as one burst.
This process does nothing else. It answers 200 with a messageId, and on SIGTERM writes the
arrival times (CLOCK_MONOTONIC seconds, comparable across processes) as JSON to `--out`.

    python -m benchmarks.timing_provider --out arrivals.json   (prints the port it listens on)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from aiohttp import web


def start(out: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Start one in a process of its own; returns it and its port. Stop it with terminate()."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.timing_provider", "--out", str(out)],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def busiest_second(arrivals: list[float]) -> int:
    """The most arrivals in any window [t, t + 1 s)."""
    times = sorted(arrivals)
    busiest, first = 0, 0
    for last, t in enumerate(times):
        while t - times[first] >= 1.0:
            first += 1
        busiest = max(busiest, last - first + 1)
    return busiest


async def main(port: int, out: Path) -> None:
    arrivals: list[float] = []

    async def send(request: web.Request) -> web.Response:
        arrivals.append(time.monotonic())
        await request.read()
        return web.json_response({"messageId": f"m-{len(arrivals)}"})

    app = web.Application()
    app.router.add_post("/send", send)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print(site._server.sockets[0].getsockname()[1], flush=True)  # type: ignore[union-attr]
    await stop.wait()
    await runner.cleanup()
    out.write_text(json.dumps(arrivals))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    asyncio.run(main(args.port, args.out))
