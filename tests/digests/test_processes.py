"""Digests through real processes (docs/digests.md): two `notify-queue api` processes add items
to the same digests while two `notify-queue worker` processes close and send them through the
HTTP provider, with webhooks on. Every item ends SENT exactly once (one webhook event each), each
digest is one provider call (its id the Idempotency-Key), the calls carry every item once, items
added after a close start a new digest, maxItems closes a digest, the waiting reason is
DigestWindow through the API, a cancel leaves an open digest and all cancelled sends nothing, and
bad digests are 400s. Small windows (1 s) and few processes keep it short; every wait is a poll
with a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

from tests.receivers import WebhookReceiver
from tests.support import eventually, running_api


class CountingProvider:
    """An HTTP provider (CONTRACT section 5) that records every call and answers a message id."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> CountingProvider:
        app = web.Application()
        app.router.add_post("/send", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/send"
        return self

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append({"key": request.headers["Idempotency-Key"], **body})
        return web.json_response({"messageId": f"m-{len(self.calls)}"})

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@contextlib.contextmanager
def workers(database_url: str, provider_url: str, webhook_url: str, log: Path) -> Iterator[None]:
    out = log.open("wb")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "notify_queue",
                "worker",
                "--database-url",
                database_url,
                "--poll-interval",
                "0.2",
                "--log-level",
                "WARNING",
                "--provider",
                "http",
                "--provider-url",
                provider_url,
                "--webhook-url",
                webhook_url,
                "--rate-limit",
                "1000",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        for _ in range(2)
    ]
    try:
        yield
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        out.close()


@contextlib.asynccontextmanager
async def peers() -> AsyncIterator[tuple[CountingProvider, WebhookReceiver]]:
    provider, hooks = await CountingProvider().start(), await WebhookReceiver().start()
    try:
        yield provider, hooks
    finally:
        await provider.stop()
        await hooks.stop()


def item(recipient: str, key: str, body: str, **digest: Any) -> dict[str, Any]:
    return {
        "channel": "email",
        "recipient": recipient,
        "subject": f"{body} liked your post",
        "body": body,
        "digest": {"key": key, "windowSeconds": 1, **digest},
    }


async def post(http: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    response = await http.post(
        "/notifications", json=body, headers={"Idempotency-Key": uuid.uuid4().hex}
    )
    assert response.status_code == 201, response.text
    return dict(response.json())


async def test_digests_through_two_apis_and_two_workers(database_url: str, tmp_path: Path) -> None:
    async with (
        peers() as (provider, hooks),
        running_api(database_url, tmp_path / "api-a.log") as url_a,
        running_api(database_url, tmp_path / "api-b.log") as url_b,
        httpx.AsyncClient(base_url=url_a) as a,
        httpx.AsyncClient(base_url=url_b) as b,
    ):
        # Bad digests: 400 with the field named.
        bad = await a.post(
            "/notifications",
            json={**item("x@example.com", "k", "x"), "priority": "HIGH"},
            headers={"Idempotency-Key": "bad-1"},
        )
        assert bad.status_code == 400
        assert bad.headers["content-type"].startswith("application/problem+json")
        assert [e["field"] for e in bad.json()["errors"]] == ["digest"]
        bad = await b.post(
            "/notifications",
            json={**item("x@example.com", "k", "x"), "digest": {"key": "k", "windowSeconds": 0}},
            headers={"Idempotency-Key": "bad-2"},
        )
        assert bad.status_code == 400
        assert [e["field"] for e in bad.json()["errors"]] == ["digest.windowSeconds"]

        # Held open for the test (a window of an hour): waiting, cancel one, cancel all.
        held = [
            await post(
                a,
                {
                    **item("held@example.com", "held", n),
                    "digest": {"key": "held", "windowSeconds": 3600},
                },
            )
            for n in ("p", "q")
        ]
        assert held[0]["waiting"]["reason"] == "DigestWindow"
        listed = (await b.get("/notifications", params={"waiting": "DigestWindow"})).json()
        assert {n["id"] for n in held} <= {n["id"] for n in listed["items"]}
        gone = await b.post(f"/notifications/{held[0]['id']}/cancel")
        assert gone.status_code == 200 and gone.json()["status"] == "CANCELLED"
        left = (await a.get(f"/notifications/{held[1]['id']}")).json()
        assert left["digest"]["count"] == 1 and left["digest"]["id"] == held[0]["digest"]["id"]
        assert (await a.post(f"/notifications/{held[1]['id']}/cancel")).status_code == 200

        with workers(database_url, provider.url, hooks.url, tmp_path / "workers.log"):
            # Both APIs add to the same recipients' digests at once, in waves, while the workers
            # close them (windows of 1 s): every wave may meet a digest closing.
            made: list[dict[str, Any]] = []
            for wave in range(4):
                bodies = [item("ana@example.com", "likes", f"ana-{wave}-{i}") for i in range(6)] + [
                    item("bo@example.com", "follows", f"bo-{wave}-{i}", maxItems=3)
                    for i in range(6)
                ]
                made += await asyncio.gather(
                    *(post(a if i % 2 else b, body) for i, body in enumerate(bodies))
                )
                await asyncio.sleep(0.4)  # spreads the waves over the windows; not a sync

            async def all_sent() -> list[dict[str, Any]] | None:
                now = [
                    n
                    for who in ("ana@example.com", "bo@example.com")
                    for n in (
                        await a.get("/notifications", params={"recipient": who, "limit": 1000})
                    ).json()["items"]
                ]
                done = len(now) == len(made) and all(n["status"] == "SENT" for n in now)
                return now if done else None

            final = await eventually(all_sent, timeout=120, what="every item SENT")

            async def events_in() -> bool:
                return len(hooks.received) >= len(made)

            await eventually(events_in, timeout=60, what="a webhook event per item")

    by_digest: dict[str, list[dict[str, Any]]] = {}
    for n in final:
        by_digest.setdefault(n["digest"]["id"], []).append(n)
    calls = Counter(c["key"] for c in provider.calls)
    # One provider call per digest, keyed by the digest id; none for the cancelled digest.
    assert set(calls) == set(by_digest) and set(calls.values()) == {1}
    assert held[0]["digest"]["id"] not in calls
    # Each call carried exactly the items of its digest, and every item once.
    for number, call in enumerate(provider.calls, start=1):
        items = by_digest[call["key"]]
        assert call["metadata"]["digest"]["count"] == len(items)
        assert sorted(call["body"].split("\n")) == sorted(n["body"] for n in items)
        # The same final status and provider message id on every item of the digest.
        assert {n["providerMessageId"] for n in items} == {f"m-{number}"}
    assert sum(len(v) for v in by_digest.values()) == len(made)
    # maxItems 3: bo's digests never hold more than 3; more than one digest per recipient.
    bo = [v for v in by_digest.values() if v[0]["recipient"] == "bo@example.com"]
    assert all(len(v) <= 3 for v in bo) and len(bo) >= 8
    # Ana's waves span more than her window (1 s): her later items opened a new digest.
    assert len([v for v in by_digest.values() if v[0]["recipient"] == "ana@example.com"]) >= 2
    # Each item its own webhook event, once.
    jobs = Counter(r.json["jobId"] for r in hooks.received if r.json["status"] == "SENT")
    assert set(jobs) == {n["id"] for n in made} and set(jobs.values()) == {1}
