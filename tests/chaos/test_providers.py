"""Provider chains, circuit breakers, failover and shared rate limits, through real workers.

Two fake providers are real aiohttp servers on loopback (CONTRACT section 5); `notify-queue
worker` processes read a providers file naming them. Provider A can be down (nothing listens on
its port: connection refused), hang, or answer 410; every call is recorded at the provider with
its arrival time, so what is counted is what the provider saw.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from benchmarks import timing_provider

from notify_queue.models import Channel, Failover, Policy, Status
from notify_queue.repositories.db import Database
from notify_queue.repositories.policies import PolicyRepository
from tests.chaos.harness import poll, quick_flags, read_rows, record
from tests.support import free_port, new, notification_service


class FakeProvider:
    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/send"
        self.arrivals: list[tuple[float, str]] = []  # (monotonic time, idempotency key)
        self.hang = False
        self._runner: web.AppRunner | None = None

    async def start(self) -> FakeProvider:
        app = web.Application()
        app.router.add_post("/send", self._send)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _send(self, request: web.Request) -> web.Response:
        self.arrivals.append((time.monotonic(), request.headers["Idempotency-Key"]))
        body = await request.json()
        if self.hang:
            await asyncio.sleep(3600)
        if body["recipient"].startswith("gone-"):
            return web.Response(status=410, text="token unregistered")
        return web.json_response({"messageId": f"m-{uuid.uuid4().hex[:8]}"})


@pytest.fixture
async def providers() -> AsyncIterator[tuple[FakeProvider, FakeProvider]]:
    a, b = FakeProvider(), await FakeProvider().start()  # A starts down
    yield a, b
    await a.stop()
    await b.stop()


def _providers_file(tmp_path: Path, providers: list[dict[str, Any]], chain: list[str]) -> str:
    path = tmp_path / "providers.yaml"
    channels = providers[0]["channels"]
    path.write_text(
        yaml.safe_dump({"providers": providers, "chains": dict.fromkeys(channels, chain)})
    )
    return str(path)


def _flags(providers_file: str, *extra: str) -> list[str]:
    return quick_flags("--providers-file", providers_file, *extra)


async def _send_wave(db: Database, n: int, tag: str, **fields: Any) -> list[uuid.UUID]:
    service = notification_service(db, max_attempts=fields.pop("max_attempts", 6))
    created = await service.enqueue_many(
        [new(recipient=f"{tag}-{i}@example.com", **fields) for i in range(n)]
    )
    return [c.notification.id for c in created]


async def _final_rows(db: Database, ids: list[uuid.UUID]) -> list[dict[str, Any]] | None:
    rows = await read_rows(
        db,
        "SELECT id, status, provider, attempt_count, last_error, delivery_attempts"
        " FROM nq_all_notifications WHERE id = ANY(%(ids)s)",
        {"ids": ids},
    )
    return rows if all(Status(r["status"]).is_final for r in rows) else None


async def _circuit(db: Database, name: str) -> dict[str, Any]:
    rows = await read_rows(
        db, "SELECT * FROM nq_provider_circuits WHERE provider = %(p)s", {"p": name}
    )
    return rows[0]


def _calls_to(rows: list[dict[str, Any]], provider: str) -> int:
    """Calls made to `provider` according to the delivery record (skips are not calls)."""
    return sum(
        1
        for r in rows
        for a in r["delivery_attempts"]
        if a["provider"] == provider and a["outcome"] not in ("circuit_open", "provider_limited")
    )


async def test_a_down_provider_fails_over_opens_its_circuit_and_gets_traffic_back_after_a_probe(
    db: Database, database_url: str, providers: tuple[FakeProvider, FakeProvider], spawn, tmp_path
) -> None:
    a, b = providers
    path = _providers_file(
        tmp_path,
        [
            {
                "name": "a",
                "type": "http",
                "channels": ["email", "sms", "push", "voice"],
                "url": a.url,
                "circuitBreaker": {"failures": 3, "openFor": "3s"},
            },
            {
                "name": "b",
                "type": "http",
                "channels": ["email", "sms", "push", "voice"],
                "url": b.url,
            },
        ],
        ["a", "b"],
    )
    procs = spawn(database_url)
    worker = procs.start(*_flags(path))
    await procs.ready(worker)

    # Wave 1, A down: each attempt finds A's port closed (nothing sent) and moves on to B.
    first_ids = await _send_wave(db, 5, "w1")
    first = await poll(lambda: _final_rows(db, first_ids), timeout=30)
    assert all(r["status"] == Status.SENT and r["provider"] == "b" for r in first)
    assert all(r["attempt_count"] == 1 for r in first)
    assert first[0]["delivery_attempts"][0]["provider"] == "a"
    assert first[0]["delivery_attempts"][0]["outcome"] == "temporary_failure"
    circuit = await poll(lambda: _circuit_in(db, "a", "open"), timeout=10, what="A's circuit open")
    assert circuit["failures"] >= 3

    # Wave 2, circuit open: not one call to A, everything to B.
    second_ids = await _send_wave(db, 10, "w2")
    second = await poll(lambda: _final_rows(db, second_ids), timeout=30)
    assert all(r["status"] == Status.SENT and r["provider"] == "b" for r in second)
    assert _calls_to(second, "a") == 0
    assert (await _circuit(db, "a"))["state"] == "open"

    # A comes back; after the cool-down one notification probes it, the circuit closes, and
    # traffic returns to A.
    await a.start()
    await poll(lambda: _circuit_in(db, "a", "closed", send_to=db), timeout=30, what="closed")
    third_ids = await _send_wave(db, 5, "w3")
    third = await poll(lambda: _final_rows(db, third_ids), timeout=30)
    assert all(r["status"] == Status.SENT and r["provider"] == "a" for r in third)
    assert len({key for _, key in a.arrivals}) >= 6  # the probe and wave 3
    assert worker.poll() is None


async def _circuit_in(
    db: Database, name: str, state: str, send_to: Database | None = None
) -> dict[str, Any] | None:
    """The circuit when in `state`; with `send_to`, keeps a notification coming so a probe can
    happen (a probe is a real notification)."""
    circuit = await _circuit(db, name)
    if circuit["state"] == state:
        return circuit
    if send_to is not None:
        await _send_wave(send_to, 1, f"probe-{uuid.uuid4().hex[:6]}")
    return None


@pytest.mark.parametrize("failover", [None, "Always"])
async def test_after_a_timeout_the_default_waits_for_the_same_provider_and_always_fails_over(
    db: Database,
    database_url: str,
    providers: tuple[FakeProvider, FakeProvider],
    spawn,
    tmp_path,
    failover: str | None,
) -> None:
    a, b = providers
    await a.start()
    a.hang = True
    path = _providers_file(
        tmp_path,
        [
            {"name": "a", "type": "http", "channels": ["email"], "url": a.url, "timeout": "1s"},
            {"name": "b", "type": "http", "channels": ["email"], "url": b.url},
        ],
        ["a", "b"],
    )
    policy = None
    if failover is not None:
        policy = "ns/one-time-codes"
        await PolicyRepository(db).policy_upsert(
            policy=Policy(name=policy, failover=Failover(failover)), ready=True
        )
    procs = spawn(database_url)
    worker = procs.start(*_flags(path, "--channels", "email"))
    await procs.ready(worker)
    ids = await _send_wave(db, 1, "otp", max_attempts=2, policy=policy)
    [row] = await poll(lambda: _final_rows(db, ids), timeout=30)
    if failover is None:
        # The outcome after a timeout is unknown: B (which might duplicate) is never tried.
        assert row["status"] == Status.DEAD_LETTERED and row["attempt_count"] == 2
        assert [x["provider"] for x in row["delivery_attempts"]] == ["a", "a"]
        assert b.arrivals == []
    else:
        assert row["status"] == Status.SENT and row["provider"] == "b"
        assert row["attempt_count"] == 1
        assert [x["provider"] for x in row["delivery_attempts"]] == ["a", "b"]
        assert len(b.arrivals) == 1
    assert worker.poll() is None


@pytest.mark.parametrize("limited", [True, False])
async def test_four_workers_keep_a_provider_under_its_rate_limit_in_every_second(
    db: Database, database_url: str, spawn, tmp_path: Path, limited: bool
) -> None:
    """With `limited` False, the negative control: the same drain without the limit exceeds it,
    so the measurement can see a violation.

    Only what a slow machine cannot break is asserted: the upper bound and counts. How close to
    the limit the drain runs is a speed figure: the provider_limit benchmark measures it
    (`rate_vs_limit`). The limit is low so that the slack between slots is wide in time: N + 2
    calls in one second at the provider need 0.04 + 1.04 / N s of stall between a delivery's
    slot and its arrival (144 ms at 10/s, 61 ms at 50/s: the 51 once seen in CI at 50/s was
    such a stall on a busy 2-core machine)."""
    per_second = 10
    total = 300  # about 31 s at 10/s
    arrivals_file = tmp_path / "arrivals.json"
    provider, port = timing_provider.start(arrivals_file)
    try:
        path = _providers_file(
            tmp_path,
            [
                {
                    "name": "a",
                    "type": "http",
                    "channels": ["email", "sms", "push", "voice"],
                    "url": f"http://127.0.0.1:{port}/send",
                    "rateLimit": {"perSecond": per_second} if limited else None,
                }
            ],
            ["a"],
        )
        procs = spawn(database_url)
        workers = [procs.start(*_flags(path)) for _ in range(4)]
        await procs.ready(*workers)
        ids = await _send_wave(db, total, "bulk")
        await poll(lambda: _unfinished_none(db), timeout=180, interval=1.0, what="all sent")
    finally:
        provider.terminate()
        provider.wait(timeout=10)
    rows = await read_rows(
        db,
        "SELECT status, attempt_count FROM nq_all_notifications WHERE id = ANY(%(ids)s)",
        {"ids": ids},
    )
    assert {r["status"] for r in rows} == {Status.SENT}
    # Waiting for a slot never used an attempt.
    assert {r["attempt_count"] for r in rows} == {1}
    times = sorted(json.loads(arrivals_file.read_text()))
    assert len(times) == total  # one call per notification: none lost, none repeated
    busiest = timing_provider.busiest_second(times)
    record(f"provider rate limit {per_second}/s", {"limited": limited, "busiest_second": busiest})
    if not limited:
        assert busiest > per_second, busiest
        return
    # The reservations never put more than N slots in a second (exact, and property-tested in
    # tests/properties/test_provider_state.py). At the provider's clock a delivery that stalls
    # more than the slack between its slot check and its request's arrival can land one call in
    # the next window (docs/providers.md); more than one is a bug.
    assert busiest <= per_second + 1, f"{busiest} calls in one second"
    assert all(w.poll() is None for w in workers)


async def _unfinished_none(db: Database) -> bool:
    rows = await read_rows(
        db,
        "SELECT count(*) AS n FROM nq_all_notifications WHERE status IN ('PENDING', 'PROCESSING')",
    )
    return bool(rows[0]["n"] == 0)


async def test_a_push_token_the_provider_calls_gone_fails_after_one_attempt(
    db: Database, database_url: str, providers: tuple[FakeProvider, FakeProvider], spawn, tmp_path
) -> None:
    _, b = providers
    path = _providers_file(
        tmp_path, [{"name": "b", "type": "http", "channels": ["push"], "url": b.url}], ["b"]
    )
    procs = spawn(database_url)
    worker = procs.start(*_flags(path, "--channels", "push"))
    await procs.ready(worker)
    ids = await _send_wave(db, 1, "gone", channel=Channel.PUSH)
    [row] = await poll(lambda: _final_rows(db, ids), timeout=30)
    assert row["status"] == Status.FAILED and row["attempt_count"] == 1
    assert row["last_error"].startswith("address no longer valid: HTTP 410")
    assert len(b.arrivals) == 1
    assert json.loads(json.dumps(row["delivery_attempts"]))[0]["outcome"] == "permanent_failure"


async def test_a_gone_push_token_is_removed_from_the_stored_recipient(
    db: Database, database_url: str, providers: tuple[FakeProvider, FakeProvider], spawn, tmp_path
) -> None:
    _, b = providers
    path = _providers_file(
        tmp_path, [{"name": "b", "type": "http", "channels": ["push"], "url": b.url}], ["b"]
    )
    procs = spawn(database_url)
    port = free_port()
    procs.start_api(port)
    worker = procs.start(*_flags(path, "--channels", "push"))
    await procs.ready(worker)
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:

        async def api_up() -> bool:
            try:
                async with http.get("/readyz") as response:
                    return response.status == 200
            except aiohttp.ClientError:
                return False

        await poll(api_up, timeout=30, what="the API")
        async with http.put(
            "/recipients/u-1", json={"pushTokens": ["gone-device-1", "device-2"]}
        ) as response:
            assert response.status == 201
        async with http.post(
            "/notifications",
            json={"recipientId": "u-1", "channels": ["push"], "body": "hello"},
            headers={"Idempotency-Key": "hello-u-1"},
        ) as response:
            assert response.status == 201, await response.text()
            [made] = (await response.json())["notifications"]
        [row] = await poll(lambda: _final_rows(db, [uuid.UUID(made["id"])]), timeout=30)
        assert row["status"] == Status.FAILED and row["attempt_count"] == 1
        async with http.get("/recipients/u-1") as response:
            assert (await response.json())["pushTokens"] == ["device-2"]
