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


# Scripted answers of the vendor receiver, by vendor and name: what each vendor's API answers
# (status, JSON body or text, headers), from its public reference.
_SLACK_ANSWERS: dict[str, tuple[int, Any, dict[str, str]]] = {
    "ratelimited": (429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "30"}),
    "channel_not_found": (200, {"ok": False, "error": "channel_not_found"}, {}),
    "not_in_channel": (200, {"ok": False, "error": "not_in_channel"}, {}),
    "invalid_auth": (200, {"ok": False, "error": "invalid_auth"}, {}),
    "500": (500, "upstream error", {}),
}
_TEAMS_ANSWERS: dict[str, tuple[int, Any, dict[str, str]]] = {
    "429": (429, "Too Many Requests", {"Retry-After": "30"}),
    "400": (400, "Bad payload: the card is not a valid Adaptive Card", {}),
    "404": (404, "workflow not found", {}),
    "500": (500, "server error", {}),
}
_PAGERDUTY_ANSWERS: dict[str, tuple[int, Any, dict[str, str]]] = {
    "400": (
        400,
        {
            "status": "invalid event",
            "message": "Event object is invalid",
            "errors": ["Length of 'routing_key' is incorrect (should be 32 characters)"],
        },
        {},
    ),
    "429": (
        429,
        {
            "status": "throttle event",
            "message": "Requests for this service are arriving too quickly.  Please retry later.",
        },
        {},
    ),
    "500": (500, "Internal Server Error", {}),
}
_OPSGENIE_ANSWERS: dict[str, tuple[int, Any, dict[str, str]]] = {
    "401": (401, {"message": "Could not authenticate", "took": 0.0, "requestId": "r-401"}, {}),
    "422": (
        422,
        {
            "message": "Request body is not processable. Please check the errors.",
            "errors": {"responders#0": "No team exists with name [nobody]"},
            "took": 0.0,
            "requestId": "r-422",
        },
        {},
    ),
    "429": (
        429,
        {"message": "Too many requests", "took": 0.0},
        {"X-RateLimit-State": "THROTTLED", "Retry-After": "30"},
    ),
    "500": (500, {"message": "Internal Server Error", "took": 0.0}, {}),
}


@dataclass
class VendorRequest:
    vendor: str
    path: str
    headers: dict[str, str]
    body: str
    at: float  # the receiver's monotonic clock when it arrived

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class VendorReceiver:
    """Speaks the wire format of Slack's `chat.postMessage` and incoming webhooks, a Teams
    Workflows webhook, a plain webhook, PagerDuty's Events API v2 and Opsgenie's Alert API, on
    loopback. Records every request; `script[vendor]` holds the answers to give next, by name
    (`_SLACK_ANSWERS`... ; `ok` or an empty script: the vendor's success)."""

    script: dict[str, list[str]] = field(default_factory=dict)
    received: list[VendorRequest] = field(default_factory=list)
    base: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> VendorReceiver:
        app = web.Application()
        app.router.add_post("/slack/api/chat.postMessage", self._slack)
        app.router.add_post("/slack/hook/{name}", self._plain("slack-hook", {}))
        app.router.add_post("/teams/{name}", self._plain("teams", _TEAMS_ANSWERS, ok=202))
        app.router.add_post("/hooks/{name}", self._plain("webhook", _TEAMS_ANSWERS, ok=204))
        app.router.add_post("/pagerduty/v2/enqueue", self._pagerduty)
        app.router.add_post("/opsgenie/v2/alerts", self._opsgenie)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base = f"http://127.0.0.1:{port}"
        return self

    def of(self, vendor: str) -> list[VendorRequest]:
        return [r for r in self.received if r.vendor == vendor]

    async def _record(self, vendor: str, request: web.Request) -> str:
        loop = asyncio.get_running_loop()
        self.received.append(
            VendorRequest(
                vendor, request.path, dict(request.headers), await request.text(), loop.time()
            )
        )
        queue = self.script.get(vendor) or []
        return queue.pop(0) if queue else "ok"

    @staticmethod
    def _answer(answer: tuple[int, Any, dict[str, str]]) -> web.Response:
        status, body, headers = answer
        if isinstance(body, str):
            return web.Response(status=status, text=body, headers=headers)
        return web.json_response(body, status=status, headers=headers)

    async def _slack(self, request: web.Request) -> web.Response:
        name = await self._record("slack", request)
        if name != "ok":
            return self._answer(_SLACK_ANSWERS[name])
        channel = json.loads(self.received[-1].body).get("channel")
        ts = f"{1700000000 + len(self.received)}.000100"
        return web.json_response({"ok": True, "channel": channel, "ts": ts, "message": {}})

    def _plain(
        self, vendor: str, answers: dict[str, tuple[int, Any, dict[str, str]]], ok: int = 200
    ) -> Any:
        async def handle(request: web.Request) -> web.Response:
            name = await self._record(vendor, request)
            if name != "ok":
                return self._answer(answers[name])
            return web.Response(status=ok, text="ok" if ok == 200 else "")

        return handle

    async def _pagerduty(self, request: web.Request) -> web.Response:
        name = await self._record("pagerduty", request)
        if name != "ok":
            return self._answer(_PAGERDUTY_ANSWERS[name])
        dedup_key = json.loads(self.received[-1].body).get("dedup_key")
        return web.json_response(
            {"status": "success", "message": "Event processed", "dedup_key": dedup_key},
            status=202,
        )

    async def _opsgenie(self, request: web.Request) -> web.Response:
        name = await self._record("opsgenie", request)
        if name != "ok":
            return self._answer(_OPSGENIE_ANSWERS[name])
        request_id = f"og-{len(self.received)}"
        return web.json_response(
            {"result": "Request will be processed", "took": 0.2, "requestId": request_id},
            status=202,
        )

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
