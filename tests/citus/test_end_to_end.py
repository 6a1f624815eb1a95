"""Every role on the real Citus cluster (issue 21, CONTRACT section 11): the API (single and
batch creates, a repeated key 201/200/409, cancel, retry), two `notify-queue worker` processes
with an HTTP provider and the webhook relay, a worker node restarted mid-run. Every notification
reaches the provider once and ends SENT, the per-recipient limit holds, the webhooks arrive.

Real parts: the cluster of tests/citus/cluster.py, `notify-queue migrate|api|worker` as
processes, an HTTP provider and a webhook receiver on loopback. A few hundred notifications: the
run is about the shapes Citus plans, not about throughput."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from aiohttp import web

from tests.citus.cluster import CitusCluster
from tests.citus.test_cluster import rows_per_worker
from tests.citus.test_layout import migrate
from tests.receivers import WebhookReceiver
from tests.support import eventually, running_api

pytestmark = pytest.mark.citus

SINGLES = 120
BATCHES = 2
BATCH_SIZE = 40
RATE_LIMIT = 5
BUSY = 8  # notifications to one recipient over its limit


class CountingProvider:
    """An HTTP provider: counts POSTs per notification id; the first POST for a recipient that
    starts with `fail-` is answered 400 (a definite failure), every other one 204."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.sent: Counter[str] = Counter()
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> CountingProvider:
        app = web.Application()
        app.router.add_post("/deliver", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/deliver"
        return self

    async def _handle(self, request: web.Request) -> web.Response:
        body = json.loads(await request.text())
        self.calls[body["id"]] += 1
        if body["recipient"].startswith("fail-") and self.calls[body["id"]] == 1:
            return web.Response(status=400, text="refused once")
        self.sent[body["id"]] += 1
        return web.Response(status=204)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@contextlib.contextmanager
def workers(url: str, tmp_path: Path, provider: str, hooks: str) -> Iterator[None]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFY_QUEUE_")}
    processes = []
    for i in range(2):
        command = [sys.executable, "-m", "notify_queue", "worker", "--database-url", url]
        command += ["--provider", "http", "--provider-url", provider, "--webhook-url", hooks]
        command += ["--rate-limit", str(RATE_LIMIT), "--rate-limit-window", "3600"]
        command += ["--poll-interval", "0.5", "--backoff-base", "0.2", "--lease-seconds", "60"]
        command += ["--log-level", "WARNING"]
        log = (tmp_path / f"worker-{i}.log").open("wb")
        processes.append(
            (subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT), log)
        )
    try:
        yield
    finally:
        for process, _ in processes:
            process.send_signal(signal.SIGTERM)
        for process, log in processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()


@contextlib.asynccontextmanager
async def peers() -> AsyncIterator[tuple[CountingProvider, WebhookReceiver]]:
    provider = await CountingProvider().start()
    hooks = await WebhookReceiver().start()
    try:
        yield provider, hooks
    finally:
        await provider.stop()
        await hooks.stop()


def statuses(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT status, count(*) FROM nq_all_notifications GROUP BY 1")
        return {s: int(n) for s, n in rows.fetchall()}


async def test_every_role_on_citus_sends_each_notification_once(
    citus_cluster: CitusCluster, citus_database: str, tmp_path: Path
) -> None:
    url = citus_database
    migrate(url)
    headers = {"Authorization": "Bearer t"}
    async with (
        peers() as (provider, hooks),
        running_api(url, tmp_path / "api.log", "--api-token", "t") as base,
        httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as http,
    ):

        def single(i: int, body: str = "hello") -> dict[str, object]:
            return {
                "channel": "email",
                "recipient": f"user-{i % 40}@example.com",
                "body": body,
                "idempotencyKey": f"single-{i}",
                "priority": "HIGH" if i % 7 == 0 else "NORMAL",
            }

        created = [await http.post("/notifications", json=single(i)) for i in range(SINGLES)]
        assert [r.status_code for r in created] == [201] * SINGLES, created[-1].text
        again = await http.post("/notifications", json=single(3))
        other = await http.post("/notifications", json=single(3, body="different"))
        assert (again.status_code, again.json()["id"]) == (200, created[3].json()["id"])
        assert other.status_code == 409, other.text
        for b in range(BATCHES):
            batch = await http.post(
                "/notifications/batch",
                json={
                    "notifications": [
                        {
                            "channel": "sms",
                            "recipient": f"+49151{b:02d}{i:06d}",
                            "body": "hello",
                            "idempotencyKey": f"batch-{b}-{i}",
                        }
                        for i in range(BATCH_SIZE)
                    ]
                },
            )
            assert [r["status"] for r in batch.json()["results"]] == [201] * BATCH_SIZE
        busy = [
            (
                await http.post(
                    "/notifications",
                    json={
                        "channel": "email",
                        "recipient": "busy@example.com",
                        "body": "hello",
                        "idempotencyKey": f"busy-{i}",
                    },
                )
            ).json()["id"]
            for i in range(BUSY)
        ]
        failing = (
            await http.post(
                "/notifications",
                json={
                    "channel": "email",
                    "recipient": "fail-1@example.com",
                    "body": "x",
                    "idempotencyKey": "fail-1",
                },
            )
        ).json()["id"]
        later = (
            await http.post(
                "/notifications",
                json={
                    "channel": "email",
                    "recipient": "later@example.com",
                    "body": "x",
                    "sendAt": "2099-01-01T00:00:00Z",
                    "idempotencyKey": "later-1",
                },
            )
        ).json()["id"]
        cancelled = await http.post(f"/notifications/{later}/cancel")
        assert (cancelled.status_code, cancelled.json()["status"]) == (200, "CANCELLED")
        total = SINGLES + BATCHES * BATCH_SIZE + BUSY + 2
        per_worker = rows_per_worker(citus_cluster, url, "nq_jobs")
        assert sorted(per_worker) == sorted(w.port for w in citus_cluster.workers)

        with workers(url, tmp_path, provider.url, hooks.url):
            # A worker node restarted while the workers claim and complete.
            await eventually(lambda: _true(len(provider.sent) >= 20), what="deliveries start")
            await asyncio.to_thread(citus_cluster.restart_worker, 0)

            async def failed() -> bool:
                return (await http.get(f"/notifications/{failing}")).json()["status"] == "FAILED"

            await eventually(failed, timeout=120, what="the refused notification FAILED")
            retried = await http.post(f"/notifications/{failing}/retry")
            assert (retried.status_code, retried.json()["status"]) == (200, "PENDING")

            expected_sent = total - 1 - (BUSY - RATE_LIMIT)

            async def all_sent() -> bool:
                return statuses(url).get("SENT", 0) >= expected_sent

            await eventually(all_sent, timeout=300, what=f"{expected_sent} SENT")

            async def hooks_arrived() -> bool:
                sent = {r.json["jobId"] for r in hooks.received if r.json["status"] == "SENT"}
                return len(sent) >= expected_sent

            await eventually(hooks_arrived, timeout=120, what="a webhook per final notification")
            status = (await http.get("/status")).json()

    assert statuses(url) == {
        "SENT": expected_sent,
        "CANCELLED": 1,
        "PENDING": BUSY - RATE_LIMIT,
    }
    # Each notification reached the provider once (the refused one twice: refused, then sent).
    assert set(provider.sent.values()) == {1}
    assert len(provider.sent) == expected_sent
    assert provider.calls[failing] == 2
    assert sum(1 for i in busy if i in provider.sent) == RATE_LIMIT
    with psycopg.connect(url) as conn:
        waits = conn.execute(
            "SELECT waiting_reason, count(*) FROM nq_jobs WHERE status = 'PENDING' GROUP BY 1"
        ).fetchall()
    assert waits == [("RecipientRateLimit", BUSY - RATE_LIMIT)]
    assert status["database"] == {"engine": "citus", "workerNodes": 2}
    assert status["counts"]["SENT"] == expected_sent
    events = Counter((r.json["jobId"], r.json["status"]) for r in hooks.received)
    assert {i for i, s in events if s == "SENT"} == set(provider.sent)
    assert events[(failing, "FAILED")] >= 1


async def _true(value: bool) -> bool:
    return value
