"""Real HTTP peers on loopback for tests: a webhook receiver and an HTTP provider."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Received:
    headers: dict[str, str]
    body: str

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class WebhookReceiver:
    """Records every POST; answers `fail_first` of them with 503, then 204 (or always 503)."""

    fail_first: int = 0
    always_fail: bool = False
    received: list[Received] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> WebhookReceiver:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/hooks"
        return self

    async def _handle(self, request: web.Request) -> web.Response:
        self.received.append(Received(dict(request.headers), await request.text()))
        self.arrived.set()
        if self.always_fail or len(self.received) <= self.fail_first:
            return web.Response(status=503, text="not now")
        return web.Response(status=204)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
