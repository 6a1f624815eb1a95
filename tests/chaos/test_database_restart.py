"""PostgreSQL stopped and restarted in the middle of a run, cleanly (`fast`) and as a crash
(`immediate`: no checkpoint, crash recovery at the next start).

Two worker processes and the API (`notify-queue api`, a subprocess) run against a server with
PostgreSQL's durable defaults. A client keeps POSTing batches to the API throughout; batches
that fail while the database is away are sent again afterwards with the same idempotency keys,
as a client would. Checked: the API answers 503 (problem+json) while the database is down and
recovers by itself; the workers never exit and reconnect by themselves; every notification the
API accepted (201 or 200) ends final, delivered once, with its webhook.

The operator's part of this fault belongs to the operator's own tests and is not covered here.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

import aiohttp
import pytest

from notify_queue.embedded import EmbeddedPostgres
from notify_queue.repositories.db import Database
from tests.chaos.harness import audit, lost_outcomes_bound, poll, read_rows, record, worker_flags
from tests.chaos.peers import ChaosProvider, SignedWebhookReceiver
from tests.support import free_port

DOWN_SECONDS = 3.0
BATCH = 25


@dataclass
class Client:
    """An API client that keeps enqueueing and remembers what was accepted."""

    base: str
    accepted: dict[str, uuid.UUID] = field(default_factory=dict)  # idempotency key -> id
    unanswered: list[list[dict[str, str]]] = field(default_factory=list)
    answers: dict[int, int] = field(default_factory=dict)
    errors: int = 0
    sent_batches: int = 0

    async def send(self, http: aiohttp.ClientSession, items: list[dict[str, str]]) -> bool:
        self.sent_batches += 1
        try:
            async with http.post(
                f"{self.base}/notifications/batch", json={"notifications": items}
            ) as r:
                self.answers[r.status] = self.answers.get(r.status, 0) + 1
                if r.status != 200:
                    assert r.status == 503, await r.text()
                    assert r.content_type == "application/problem+json"
                    self.unanswered.append(items)
                    return False
                body = await r.json()
        except (aiohttp.ClientError, TimeoutError):
            self.errors += 1
            self.unanswered.append(items)
            return False
        for item, result in zip(items, body["results"], strict=True):
            assert result["status"] in (200, 201), result
            self.accepted[item["idempotencyKey"]] = uuid.UUID(result["notification"]["id"])
        return True

    async def keep_sending(self, http: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.send(http, _items(BATCH))
            await asyncio.sleep(0.1)

    async def resend_unanswered(self, http: aiohttp.ClientSession) -> None:
        pending, self.unanswered = self.unanswered, []
        for items in pending:
            assert await self.send(http, items), "the API did not recover"


def _items(n: int) -> list[dict[str, str]]:
    items = []
    for _ in range(n):
        token = uuid.uuid4().hex
        items.append(
            {
                "idempotencyKey": f"restart-{token}",
                "channel": "email",
                "recipient": f"r-{token[:12]}@example.com",
                "body": "across a restart",
            }
        )
    return items


async def _status(http: aiohttp.ClientSession, url: str) -> int:
    try:
        async with http.get(url) as r:
            return r.status
    except (aiohttp.ClientError, TimeoutError):
        return 0


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_workers_and_the_api_ride_out_a_postgresql_restart_and_nothing_accepted_is_lost(
    mode: str,
    restartable_pg: EmbeddedPostgres,
    restartable_db: Database,
    provider: ChaosProvider,
    receiver: SignedWebhookReceiver,
    spawn,
) -> None:
    provider.failure_rate = 0.1
    provider.latency_seconds = 0.01
    url = restartable_db.url
    port = free_port()
    procs = spawn(url, *worker_flags(provider, receiver, lease_seconds=5, concurrency=16))
    api = procs.start_api(port)
    workers = [procs.start(), procs.start()]
    await procs.ready(*workers)
    base = f"http://127.0.0.1:{port}"
    timeout = aiohttp.ClientTimeout(total=15)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        await poll(lambda: _ok(http, f"{base}/readyz"), timeout=30, what="API ready")
        client = Client(base)
        for _ in range(20):  # 500 up front, so the restart lands in the middle of deliveries
            assert await client.send(http, _items(BATCH))
        stop = asyncio.Event()
        sender = asyncio.create_task(client.keep_sending(http, stop))
        try:
            await poll(
                lambda: _sent_at_least(restartable_db, 100), timeout=30, what="deliveries under way"
            )

            await asyncio.to_thread(restartable_pg.halt, mode=mode)
            down_at = time.monotonic()
            ready_while_down, status_while_down = await asyncio.gather(
                _status(http, f"{base}/readyz"), _status(http, f"{base}/status")
            )
            await asyncio.sleep(max(DOWN_SECONDS - (time.monotonic() - down_at), 0))
            assert all(p.poll() is None for p in workers), (
                "a worker exited while the database was down"
            )
            await asyncio.to_thread(restartable_pg.resume)
            await poll(lambda: _ok(http, f"{base}/readyz"), timeout=30, what="API ready again")
            await asyncio.sleep(1.0)  # keep sending for a moment after the restart
        finally:
            stop.set()
            await sender
        await client.resend_unanswered(http)

    ids = list(client.accepted.values())
    await poll(
        lambda: _final(restartable_db, ids), timeout=60, what="every accepted notification final"
    )
    await poll(lambda: _webhooks_settled(restartable_db), timeout=60, what="webhooks delivered")
    assert all(p.poll() is None for p in workers), "a worker exited"
    assert api.poll() is None, "the API exited"
    # The restart may cost both workers the results they had not recorded yet, and no more.
    explained = lost_outcomes_bound(workers_lost=len(workers), concurrency=16, batch_size=100)
    result = await audit(restartable_db, ids, provider, receiver, repeats_explained=explained)
    result.extra |= {
        "mode": mode,
        "api_answers": client.answers,
        "client_errors": client.errors,
        "readyz_while_down": ready_while_down,
        "status_while_down": status_while_down,
    }
    record(f"postgresql restart ({mode})", result)
    assert result.problems == []
    assert ready_while_down == 503 and status_while_down == 503
    assert client.answers.get(503, 0) + client.errors > 0, "no request met the database down"
    assert len(ids) == len(set(ids)) and len(ids) >= 500


async def _ok(http: aiohttp.ClientSession, url: str) -> bool:
    return await _status(http, url) == 200


async def _sent_at_least(db: Database, n: int) -> bool:
    rows = await read_rows(
        db, "SELECT count(*) AS n FROM nq_all_notifications WHERE status = 'SENT'"
    )
    return rows[0]["n"] >= n


async def _final(db: Database, ids: list[uuid.UUID]) -> bool:
    rows = await read_rows(
        db,
        "SELECT count(*) AS n FROM nq_all_notifications WHERE id = ANY(%(ids)s::uuid[])"
        " AND status NOT IN ('PENDING', 'PROCESSING')",
        {"ids": ids},
    )
    return rows[0]["n"] == len(ids)


async def _webhooks_settled(db: Database) -> bool:
    rows = await read_rows(
        db, "SELECT count(*) AS n FROM nq_webhook_events WHERE state <> 'delivered'"
    )
    return rows[0]["n"] == 0
