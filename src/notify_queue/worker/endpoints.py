"""The worker's --metrics-port: `/metrics` for Prometheus and `/healthz` for probes.

Served by aiohttp on the worker's own event loop, so `/healthz` answers from the same `Health`
the supervised tasks update, and a process whose loop is blocked fails its probe (a metrics
thread would keep answering 200 for a worker that no longer runs).
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from notify_queue.worker.supervision import Health


async def start_endpoints(host: str, port: int, health: Health) -> web.AppRunner:
    """Serve /metrics and /healthz (also /readyz) on host:port; close with `runner.cleanup()`."""

    async def metrics(_: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(REGISTRY))
        response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
        return response

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response(health.report(), status=200 if health.healthy else 503)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
