"""The outside world of the chaos tests: an HTTP delivery provider and a webhook receiver, both
real aiohttp servers on loopback that worker subprocesses reach over TCP.

`ChaosProvider` plays a provider that honours idempotency keys (docs/providers.md): the first
successful call with a key delivers and answers a new `messageId`; every later call with that key
answers 200 with the same `messageId` and delivers nothing. Every call is counted per key, and so
is every call answered as a success (`deliveries`): each one would have delivered a message at a
provider that ignored the key, so a key answered twice is a duplicate the audit must explain by a
fault (a crash that lost an outcome) or report.
It can fail a share of calls with 503, go into an outage (every call 503), add latency, and stall
chosen keys for a while before answering (a provider that hangs past a worker's lease).

`SignedWebhookReceiver` verifies each POST's Standard Webhooks signature with the `standardwebhooks`
library, records events by `webhook-id`, and can be taken down (its port refuses connections) and
brought back on the same port.

Both are plain classes with counters, used by the pytest fixtures and by `scripts/soak.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError


@dataclass
class Stall:
    """Hold the first `calls` calls with one key for `seconds`, then answer `status`."""

    seconds: float
    status: int = 400
    calls: int = 1


class ChaosProvider:
    def __init__(
        self, *, failure_rate: float = 0.0, latency_seconds: float = 0.0, seed: int = 7
    ) -> None:
        self.failure_rate = failure_rate
        self.latency_seconds = latency_seconds
        self.outage = False
        self.stalls: dict[str, Stall] = {}
        self.calls: Counter[str] = Counter()  # every call, per key
        # Calls answered as a success, per key: what a provider ignoring the key would have
        # delivered. The first delivers here; a value above 1 is a duplicate the key absorbed.
        self.deliveries: Counter[str] = Counter()
        self.message_ids: dict[str, str] = {}
        self.delivered_at: dict[str, float] = {}
        self.stalled_now = 0
        self.stall_answers: list[tuple[str, float]] = []  # (key, monotonic time the answer left)
        self.malformed: list[str] = []
        self.failures_answered = 0
        self._random = random.Random(seed)
        self._released = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> ChaosProvider:
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_post("/deliver", self._deliver)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/deliver"
        return self

    def release_stalls(self) -> None:
        """End every stall now (each answers its `status`); later stalls are not held."""
        self._released.set()

    async def stop(self) -> None:
        self.release_stalls()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _deliver(self, request: web.Request) -> web.Response:
        key = request.headers.get("Idempotency-Key", "")
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if (
            not key
            or request.content_type != "application/json"
            or not isinstance(body, dict)
            or body.get("id") != key
        ):
            self.malformed.append(key)
            return web.Response(status=400, text="malformed delivery request")
        self.calls[key] += 1
        stall = self.stalls.get(key)
        if stall is not None and stall.calls > 0:
            stall.calls -= 1
            self.stalled_now += 1
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._released.wait(), stall.seconds)
            finally:
                self.stalled_now -= 1
            self.stall_answers.append((key, time.monotonic()))
            return web.Response(status=stall.status, text="stalled, then refused")
        if self.outage:  # a provider in an outage fails fast
            self.failures_answered += 1
            return web.Response(status=503, text="provider outage")
        if self.latency_seconds:
            await asyncio.sleep(self.latency_seconds)
        # From here on nothing awaits: checking and recording a delivery is one step, as in a real
        # provider's idempotency layer, so two concurrent calls with one key cannot both deliver.
        existing = self.message_ids.get(key)
        if existing is not None:
            self.deliveries[key] += 1
            return web.json_response({"messageId": existing})
        if self.failure_rate and self._random.random() < self.failure_rate:
            self.failures_answered += 1
            return web.Response(status=503, text="provider temporarily unavailable")
        message_id = f"msg-{len(self.message_ids) + 1}"
        self.message_ids[key] = message_id
        self.deliveries[key] += 1
        self.delivered_at[key] = time.monotonic()
        return web.json_response({"messageId": message_id})

    @property
    def repeats(self) -> int:
        """Successful calls for a key already delivered, answered without a second delivery."""
        return sum(n - 1 for n in self.deliveries.values() if n > 1)

    def duplicates(self) -> int:
        """Keys answered as a success more than once: each would be a duplicate message at a
        provider that ignored the key; only a fault that lost an outcome may explain one."""
        return sum(1 for n in self.deliveries.values() if n > 1)


@dataclass
class ReceivedEvent:
    event_id: str
    payload: dict[str, Any]
    at: float


@dataclass
class SignedWebhookReceiver:
    secret: str
    events: dict[str, list[ReceivedEvent]] = field(default_factory=dict)
    bad_signatures: int = 0
    mismatched_ids: int = 0
    posts: int = 0
    url: str = ""
    answer_status: int = 204
    _runner: web.AppRunner | None = None
    _site: web.TCPSite | None = None
    _port: int = 0

    async def start(self) -> SignedWebhookReceiver:
        app = web.Application()
        app.router.add_post("/hooks", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await self._listen(0)
        self.url = f"http://127.0.0.1:{self._port}/hooks"
        return self

    async def _listen(self, port: int) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, "127.0.0.1", port, reuse_address=True)
        await self._site.start()
        self._port = self._site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def go_down(self) -> None:
        """Close the listening socket: new connections are refused until `come_back`."""
        if self._site is not None:
            await self._site.stop()
            self._site = None

    async def come_back(self) -> None:
        await self._listen(self._port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.Response:
        self.posts += 1
        body = await request.text()
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            Webhook(self.secret).verify(body, headers)
        except WebhookVerificationError:
            self.bad_signatures += 1
            return web.Response(status=400, text="bad signature")
        payload = json.loads(body)
        event_id = headers.get("webhook-id", "")
        if payload.get("eventId") != event_id:
            self.mismatched_ids += 1
        if self.answer_status >= 300:
            return web.Response(status=self.answer_status, text="receiver failing")
        self.events.setdefault(event_id, []).append(
            ReceivedEvent(event_id, payload, time.monotonic())
        )
        return web.Response(status=self.answer_status)

    @property
    def repeats(self) -> int:
        """Events received more than once (allowed: at least once; receivers dedupe on eventId)."""
        return sum(len(v) - 1 for v in self.events.values())
