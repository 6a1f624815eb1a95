"""A webhook receiver for the benchmarks: counts POSTs, answers 204, as cheaply as aiohttp allows.

    python -m benchmarks.receiver [--port 0]

Prints its port on the first line of stdout. `GET /count` answers the number of POSTs received
and of distinct `webhook-id`s (repeats would show at-least-once redelivery). It uses aiohttp's
low-level server (no router, no middlewares, no access log) and does not read JSON: the body is
drained, not parsed, so the receiver costs the machine as little as possible.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal

from aiohttp import web


class Counter:
    def __init__(self) -> None:
        self.posts = 0
        self.ids: set[str] = set()

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.method == "POST":
            await request.read()
            self.posts += 1
            event_id = request.headers.get("webhook-id")
            if event_id:
                self.ids.add(event_id)
            return web.Response(status=204)
        return web.Response(
            text=json.dumps({"posts": self.posts, "distinct": len(self.ids)}),
            content_type="application/json",
        )


async def serve(port: int) -> None:
    counter = Counter()
    server = web.Server(counter.handle, access_log=None)
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(server, "127.0.0.1", port, backlog=1024)
    print(listener.sockets[0].getsockname()[1], flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    listener.close()
    await server.shutdown(1.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    asyncio.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
