"""Failure handling: permanent failures, retries with backoff, dead letters, poison messages."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from aiohttp import web

from notify_queue.models import ClaimedNotification, DeliveryResult, Outcome, Priority, Status
from notify_queue.providers.simulated import SimulatedProvider
from notify_queue.repositories.db import Database
from notify_queue.services.backoff import backoff_seconds
from notify_queue.services.delivery import decide_completion
from tests.support import delivery_service, eventually, new, notification_service, start_workers

TEMPORARY = DeliveryResult(Outcome.TEMPORARY_FAILURE, error="provider down")


def _claimed(attempt: int, max_attempts: int = 6) -> ClaimedNotification:
    import uuid

    from notify_queue.models import Channel

    return ClaimedNotification(
        uuid.uuid4(),
        uuid.uuid4(),
        Channel.EMAIL,
        "a@example.com",
        None,
        "b",
        {},
        attempt,
        max_attempts,
        0.5,
        60.0,
        Priority.NORMAL,
    )


@pytest.mark.parametrize(
    ("attempt", "low", "high"), [(1, 0.5, 1), (2, 1, 2), (3, 2, 4), (4, 4, 8), (5, 8, 16)]
)
def test_the_backoff_after_each_attempt_stays_within_the_spec_table(
    attempt: int, low: float, high: float
) -> None:
    rng = random.Random(attempt)
    waits = [backoff_seconds(attempt, base=0.5, maximum=60, rng=rng) for _ in range(500)]
    assert low <= min(waits) and max(waits) <= high
    assert max(waits) - min(waits) > (high - low) / 2  # jittered, not constant


def test_the_backoff_never_exceeds_its_cap() -> None:
    assert all(backoff_seconds(n, base=0.5, maximum=60) <= 60 for n in range(1, 200))


def test_a_retry_after_hint_sets_the_wait_but_never_past_the_cap() -> None:
    hinted = DeliveryResult(Outcome.TEMPORARY_FAILURE, error="429", retry_after_seconds=7)
    assert decide_completion(_claimed(1), hinted).retry_in_seconds == 7
    too_long = DeliveryResult(Outcome.TEMPORARY_FAILURE, error="429", retry_after_seconds=3600)
    assert decide_completion(_claimed(1), too_long).retry_in_seconds == 60


def test_a_temporary_failure_on_the_last_attempt_dead_letters() -> None:
    assert decide_completion(_claimed(5), TEMPORARY).status is Status.PENDING
    assert decide_completion(_claimed(6), TEMPORARY).status is Status.DEAD_LETTERED
    assert (
        decide_completion(_claimed(7), TEMPORARY).status is Status.DEAD_LETTERED
    )  # final re-check


async def test_a_permanent_failure_fails_after_one_attempt(db: Database, database_url: str) -> None:
    created = await notification_service(db).enqueue(new(recipient="invalid@example.com"))
    provider = SimulatedProvider(0.0, 0.0, 1.0)
    workers = await start_workers(database_url, provider)
    try:
        stored = await eventually(lambda: _final(db, created.notification.id))
    finally:
        await workers.stop()
    assert stored.status is Status.FAILED and stored.attempt_count == 1
    assert "invalid" in (stored.last_error or "")
    assert provider.calls == 1


async def test_a_temporary_failure_waits_its_backoff_in_the_database(db: Database) -> None:
    created = await notification_service(db).enqueue(new())
    service = delivery_service(db)
    claimed = (await service.claim(1)).claimed[0]
    before = datetime.now(UTC)
    await service.complete([(claimed, TEMPORARY)])
    after = datetime.now(UTC)
    stored = await notification_service(db).get(created.notification.id)
    assert stored.status is Status.PENDING and stored.attempt_count == 1
    # The first backoff is 0.5-1 s from the moment of the completion, which lies between the two
    # readings however long the statement took.
    earliest = (stored.next_attempt_at - after).total_seconds()
    latest = (stored.next_attempt_at - before).total_seconds()
    assert latest >= 0.4 and earliest <= 1.1, (earliest, latest)
    assert (await service.claim(1)).claimed == []  # not due again yet


async def test_waits_of_zero_as_int_and_as_float_are_recorded_in_one_batch(db: Database) -> None:
    """A provider-limited wait of exactly 0 came out as the int 0 (`max(x, 0)`); in a batch with
    float waits psycopg refused the whole float8[] array, and the worker's completer retried that
    batch forever (seen under load in the rate-limit chaos test). Every wait is recorded."""
    await notification_service(db).enqueue_many([new(), new()])
    service = delivery_service(db)
    first, second = (await service.claim(2)).claimed
    waits = [
        DeliveryResult(Outcome.PROVIDER_LIMITED, error="limited", retry_after_seconds=0),
        DeliveryResult(Outcome.PROVIDER_LIMITED, error="limited", retry_after_seconds=0.5),
    ]
    _, recorded = await service.complete(list(zip([first, second], waits, strict=True)))
    assert recorded.accepted == {first.id, second.id}


async def test_a_notification_that_always_fails_temporarily_is_dead_lettered_after_six_attempts(
    db: Database, database_url: str
) -> None:
    created = await notification_service(db).enqueue(new())
    provider = SimulatedProvider(1.0, 0.0, 1.0)
    workers = await start_workers(database_url, provider, backoff_base=0.01, backoff_max=0.05)
    try:
        stored = await eventually(lambda: _final(db, created.notification.id), timeout=15)
    finally:
        await workers.stop()
    assert stored.status is Status.DEAD_LETTERED
    assert stored.attempt_count == 6 and stored.last_error == "simulated temporary failure"
    assert provider.calls == 6


async def test_a_provider_that_always_times_out_ends_dead_lettered(
    db: Database, database_url: str
) -> None:
    # Attempts are fixed when a notification is created, not by the worker.
    created = await notification_service(db, max_attempts=3).enqueue(
        new(recipient="timeout@example.com")
    )
    provider = SimulatedProvider(0.0, 0.0, 0.05)
    workers = await start_workers(database_url, provider, backoff_base=0.01, backoff_max=0.05)
    try:
        stored = await eventually(lambda: _final(db, created.notification.id), timeout=15)
    finally:
        await workers.stop()
    assert stored.status is Status.DEAD_LETTERED and "timed out" in (stored.last_error or "")


class _NeverAnswers:
    """A provider with a bug: it ignores its own timeout and never returns. The worker's
    deadline (its timeout + a margin, worker/deadlines.py) is what ends the call."""

    def __init__(self) -> None:
        self.calls = 0

    async def deliver(self, request: object) -> DeliveryResult:
        self.calls += 1
        await asyncio.Event().wait()
        raise AssertionError("never answers")


async def test_a_provider_that_never_returns_is_cut_off_by_the_workers_deadline(
    db: Database, database_url: str
) -> None:
    created = await notification_service(db, max_attempts=1).enqueue(new())
    provider = _NeverAnswers()
    workers = await start_workers(database_url, provider, provider_timeout=0.2)
    try:
        stored = await eventually(lambda: _final(db, created.notification.id), timeout=30)
    finally:
        await workers.stop()
    # A temporary failure (the outcome is unknown), on the last attempt: dead-lettered.
    assert stored.status is Status.DEAD_LETTERED and provider.calls == 1
    assert stored.last_error == "no answer within the worker's deadline of 1.2s"


async def _final(db: Database, id: object) -> object:
    n = await notification_service(db).get(id)  # type: ignore[arg-type]
    return n if n.status.is_final else None


def _worker_process(database_url: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
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
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def test_a_poison_notification_that_crashes_every_worker_ends_dead_lettered(
    db: Database, database_url: str
) -> None:
    # The poison: whichever worker process calls the provider with this notification dies at
    # that moment, killed from outside (SIGKILL, no chance to hand anything back), just as a
    # notification that makes a worker crash would.
    created = await notification_service(db).enqueue(new(recipient="poison@example.com"))
    current: list[subprocess.Popen[bytes]] = []

    async def kill_the_caller(request: web.Request) -> web.Response:
        os.kill(current[-1].pid, signal.SIGKILL)
        await asyncio.sleep(30)  # the caller is gone; nobody reads this answer
        return web.Response(status=500)

    app = web.Application()
    app.router.add_post("/deliver", kill_the_caller)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    crashes = 0
    try:
        for _ in range(10):
            proc = _worker_process(
                database_url,
                "--lease-seconds",
                "0.3",
                "--provider",
                "http",
                "--provider-url",
                f"http://127.0.0.1:{port}/deliver",
            )
            current.append(proc)
            code = await asyncio.to_thread(proc.wait, 20)
            if code == -signal.SIGKILL:
                crashes += 1
            await asyncio.sleep(0.4)  # let the lease run out before the next worker looks
            await delivery_service(db).housekeeping()
            stored = await notification_service(db).get(created.notification.id)
            if stored.status.is_final:
                break
    finally:
        for proc in current:
            if proc.poll() is None:
                proc.kill()
        await runner.cleanup()
    assert stored.status is Status.DEAD_LETTERED
    # Six attempts plus the one final re-check the spec allows after a crash on the last one.
    assert crashes == 7 and stored.attempt_count == 7
    assert "worker lost" in (stored.last_error or "")


async def test_sigterm_hands_claimed_work_back_without_using_an_attempt(
    db: Database, database_url: str
) -> None:
    created = await notification_service(db).enqueue_many([new() for _ in range(5)])
    proc = _worker_process(
        database_url, "--sim-latency-ms", "60000", "--shutdown-grace-seconds", "0.2"
    )
    try:
        await eventually(lambda: _processing(db, 5), timeout=15)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 15) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
    for result in created:
        stored = await notification_service(db).get(result.notification.id)
        assert stored.status is Status.PENDING and stored.attempt_count == 0
    leased = await db.fetch_all("queue_status_counts")
    assert [r["n"] for r in leased if r["status"] == "PROCESSING"] == [0]


async def _processing(db: Database, n: int) -> bool:
    rows = await db.fetch_all("queue_status_counts")
    return any(r["status"] == "PROCESSING" and r["n"] == n for r in rows)
