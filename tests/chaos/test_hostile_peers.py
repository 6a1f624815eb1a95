"""Real `notify-queue worker` processes against peers that hang, answer garbage or hang up.

Each test starts worker subprocesses (never `deliver()` calls) and real servers on loopback: an
HTTP provider and a webhook receiver written here for the occasion, and aiosmtpd for SMTP. What
is checked is what a user would see: the worker stays up, the hostile answer costs what it
should (one attempt, a sanitised `lastError`), and the next notifications go out through the
same process.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import psycopg
import pytest
from aiohttp import web
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from notify_queue.models import Channel, Status
from notify_queue.repositories.db import Database
from tests.chaos.harness import poll, quick_flags, read_rows, record
from tests.chaos.wire import StatementCounter
from tests.support import free_port, new, notification_service

BIG = 1024 * 1024


class HostilePeer:
    """An HTTP server whose answer depends on the recipient (provider) or the jobId (receiver)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()  # by recipient (provider) or webhook-id (receiver)
        self.hang_job_ids: set[str] = set()
        self.fail_job_ids: dict[str, int] = {}  # jobId -> times to answer 500 with a NUL byte
        self.paths: Counter[str] = Counter()
        self._runner: web.AppRunner | None = None
        self.base = ""

    async def start(self) -> HostilePeer:
        app = web.Application()
        app.router.add_post("/deliver", self._deliver)
        app.router.add_post("/{hook}", self._hook)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _deliver(self, request: web.Request) -> web.StreamResponse:
        recipient = (await request.json())["recipient"]
        self.calls[recipient] += 1
        kind = recipient.split("@")[0]
        if kind == "hang":
            await asyncio.sleep(3600)
        answers: dict[str, tuple[int, bytes]] = {
            "nul-fail": (503, b"gateway \x00 broke"),
            "utf8-fail": (400, b"bad \xff\xfe\xc3( request"),
            "big-fail": (400, b"x" * BIG),
            "nul-ok": (200, json.dumps({"messageId": "m\x00id"}).encode()),
            "surrogate-ok": (200, b'{"messageId": "m\\ud800id"}'),
            "big-ok": (200, json.dumps({"messageId": "m" * BIG}).encode()),
        }
        status, body = answers.get(kind, (200, json.dumps({"messageId": "fine"}).encode()))
        return web.Response(status=status, body=body)

    async def _hook(self, request: web.Request) -> web.Response:
        self.paths[request.match_info["hook"]] += 1
        event = await request.json()
        self.calls[request.headers["webhook-id"]] += 1
        job = event["jobId"]
        if job in self.hang_job_ids:
            await asyncio.sleep(3600)
        if self.fail_job_ids.get(job, 0) > 0:
            self.fail_job_ids[job] -= 1
            return web.Response(status=500, body=b"receiver \x00 down")
        return web.Response(status=204)


@pytest.fixture
async def peer() -> AsyncIterator[HostilePeer]:
    server = await HostilePeer().start()
    yield server
    await server.stop()


async def _stored(db: Database, id: uuid.UUID) -> dict[str, Any]:
    rows = await read_rows(
        db,
        "SELECT status, attempt_count, last_error, provider_message_id FROM nq_all_notifications"
        " WHERE id = %(id)s",
        {"id": id},
    )
    return rows[0]


async def _final(db: Database, id: uuid.UUID) -> dict[str, Any] | None:
    row = await _stored(db, id)
    return row if Status(row["status"]).is_final else None


async def _send(db: Database, recipient: str, **fields: Any) -> uuid.UUID:
    max_attempts = fields.pop("max_attempts", 6)
    created = await notification_service(db, max_attempts=max_attempts).enqueue(
        new(recipient=recipient, **fields)
    )
    return created.notification.id


async def test_a_provider_that_never_answers_costs_one_attempt_and_the_worker_carries_on(
    db: Database, database_url: str, peer: HostilePeer, spawn
) -> None:
    procs = spawn(database_url)
    worker = procs.start(
        *quick_flags("--provider", "http", "--provider-url", f"{peer.base}/deliver"),
        "--provider-timeout",
        "1",
    )
    await procs.ready(worker)
    hung = await _send(db, "hang@example.com", max_attempts=1)
    stored = await poll(lambda: _final(db, hung), timeout=30, what="the hung delivery timed out")
    assert stored["status"] == Status.DEAD_LETTERED and stored["attempt_count"] == 1
    assert "timed out" in stored["last_error"]

    later = [await _send(db, f"after-{i}@example.com") for i in range(5)]
    for id in later:
        row = await poll(lambda id=id: _final(db, id), timeout=30, what="later sent")
        assert row["status"] == Status.SENT
    assert worker.poll() is None, procs.log(worker)
    assert "Traceback" not in procs.log(worker)


class StallingMailbox:
    """aiosmtpd handler: mail to hang@ is held at DATA forever; the rest is accepted."""

    def __init__(self) -> None:
        self.accepted: list[str] = []

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        if any(r.startswith("hang@") for r in envelope.rcpt_tos):
            await asyncio.sleep(3600)
        self.accepted += envelope.rcpt_tos
        return "250 OK"


async def test_an_smtp_server_that_stalls_costs_one_attempt_and_the_worker_carries_on(
    db: Database, database_url: str, spawn
) -> None:
    mailbox = StallingMailbox()
    port = free_port()
    controller = Controller(mailbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        procs = spawn(database_url)
        worker = procs.start(
            *quick_flags(
                "--provider", "smtp", "--smtp-host", "127.0.0.1", "--smtp-port", str(port)
            ),
            "--channels",
            "email",
            "--provider-timeout",
            "1",
        )
        await procs.ready(worker)
        hung = await _send(db, "hang@example.com", max_attempts=1)
        stored = await poll(lambda: _final(db, hung), timeout=30, what="the stalled mail")
        assert stored["status"] == Status.DEAD_LETTERED and stored["attempt_count"] == 1
        later = [await _send(db, f"after-{i}@example.com") for i in range(3)]
        for id in later:
            row = await poll(lambda id=id: _final(db, id), timeout=30, what="later mail sent")
            assert row["status"] == Status.SENT
        assert sorted(mailbox.accepted) == sorted(f"after-{i}@example.com" for i in range(3))
        assert worker.poll() is None, procs.log(worker)
    finally:
        controller.stop()


def _clean(text: str | None) -> bool:
    return text is None or ("\x00" not in text and text.encode("utf-8") is not None)


async def test_nul_bytes_invalid_utf8_and_huge_answers_are_stored_sanitised(
    db: Database, database_url: str, peer: HostilePeer, spawn
) -> None:
    procs = spawn(database_url)
    worker = procs.start(
        *quick_flags("--provider", "http", "--provider-url", f"{peer.base}/deliver")
    )
    await procs.ready(worker)
    kinds = ["nul-fail", "utf8-fail", "big-fail", "nul-ok", "surrogate-ok", "big-ok"]
    ids = {kind: await _send(db, f"{kind}@example.com", max_attempts=1) for kind in kinds}
    rows = {kind: await poll(lambda id=id: _final(db, id), timeout=30) for kind, id in ids.items()}

    assert rows["nul-fail"]["status"] == Status.DEAD_LETTERED  # 503: temporary, one attempt
    assert rows["nul-fail"]["last_error"] == "HTTP 503: gateway \ufffd broke"
    assert rows["utf8-fail"]["status"] == Status.FAILED
    assert "\ufffd" in rows["utf8-fail"]["last_error"]
    assert rows["big-fail"]["status"] == Status.FAILED
    assert len(rows["big-fail"]["last_error"]) <= 1000
    assert rows["nul-ok"]["provider_message_id"] == "m\ufffdid"
    assert rows["surrogate-ok"]["status"] == Status.SENT
    assert "\ufffd" in rows["surrogate-ok"]["provider_message_id"]
    # A 1 MB answer is read up to the cap: it is SENT, with no id rather than a megabyte.
    assert rows["big-ok"]["status"] == Status.SENT and rows["big-ok"]["provider_message_id"] is None
    for row in rows.values():
        assert _clean(row["last_error"]) and _clean(row["provider_message_id"])

    after = await _send(db, "after@example.com")
    assert (await poll(lambda: _final(db, after), timeout=30))["status"] == Status.SENT
    assert worker.poll() is None, procs.log(worker)


async def test_a_receiver_answering_500_with_a_nul_byte_gets_retries_while_other_events_flow(
    db: Database, database_url: str, peer: HostilePeer, spawn
) -> None:
    procs = spawn(database_url)
    worker = procs.start(
        *quick_flags("--webhook-url", f"{peer.base}/hooks"),
        "--webhook-backoff-base",
        "0.1",
        "--webhook-backoff-max",
        "0.3",
    )
    await procs.ready(worker)
    failing = await _send(db, "failing@example.com")
    peer.fail_job_ids[str(failing)] = 3
    others = [await _send(db, f"other-{i}@example.com") for i in range(20)]

    async def events_delivered() -> list[dict[str, Any]] | None:
        rows = await read_rows(db, "SELECT * FROM nq_webhook_events")
        done = [r for r in rows if r["state"] == "delivered"]
        return rows if len(done) == len(others) + 1 else None

    rows = await poll(events_delivered, timeout=30, what="every event delivered")
    failed_event = next(r for r in rows if r["notification_id"] == failing)
    assert failed_event["attempts"] == 4  # three 500s with a NUL byte, then delivered
    assert all(r["attempts"] == 1 for r in rows if r["notification_id"] != failing)
    assert worker.poll() is None, procs.log(worker)


async def test_a_receiver_that_hangs_for_some_events_causes_no_resend_of_the_others(
    db: Database, database_url: str, peer: HostilePeer, spawn
) -> None:
    procs = spawn(database_url)
    worker = procs.start(
        *quick_flags("--webhook-url", f"{peer.base}/hooks"),
        "--webhook-timeout",
        "1",
        "--webhook-max-attempts",
        "1",
    )
    await procs.ready(worker)
    hanging = [f"hang-{i}@example.com" for i in range(200)]
    flowing = [f"flow-{i}@example.com" for i in range(300)]
    service = notification_service(db)
    hang_ids = [
        c.notification.id for c in await service.enqueue_many([new(recipient=r) for r in hanging])
    ]
    peer.hang_job_ids = {str(i) for i in hang_ids}
    await service.enqueue_many([new(recipient=r) for r in flowing])

    states: dict[str, int] = {}

    async def settled() -> bool:
        rows = await read_rows(
            db, "SELECT state, count(*) AS n FROM nq_webhook_events GROUP BY state"
        )
        states.clear()
        states.update({r["state"]: r["n"] for r in rows})
        return states.get("delivered", 0) + states.get("failed", 0) == 500

    try:
        await poll(settled, timeout=60, what="all 500 events delivered or failed")
    except AssertionError as exc:  # say where it stopped (seen once under load, not reproduced)
        raise AssertionError(f"{exc}; events {states}, {len(peer.calls)} posted") from None
    # Every hanging event failed on its timeout; a flowing one is delivered, unless the machine
    # was so busy that its answer took longer than the 1 s timeout too (3 of 300 with three
    # suites on 2 cores): then it failed the same way, and was not re-sent either (below).
    failed = await read_rows(
        db, "SELECT notification_id, last_error FROM nq_webhook_events WHERE state = 'failed'"
    )
    assert {str(r["notification_id"]) for r in failed} >= peer.hang_job_ids
    assert all("timed out" in (r["last_error"] or "") for r in failed), failed[:3]
    record("receiver hangs for 200 of 500", {"states": states, "posted": len(peer.calls)})
    # Longer than an event's lease (2 x timeout + 5 s): a re-claim of a delivered event would
    # have happened by now.
    await asyncio.sleep(8)
    # No event was POSTed twice: each delivered one reached the receiver once, and each failed
    # one at most once (with one attempt allowed, they are failed, not retried). A failed one
    # may not have reached it at all: on a busy machine the receiver (in this test's own event
    # loop) can read a request only after the worker's 1 s timeout ended it (27 of 500 seen so
    # with a full suite beside this one).
    delivered = await read_rows(db, "SELECT id FROM nq_webhook_events WHERE state = 'delivered'")
    assert {str(r["id"]) for r in delivered} <= set(peer.calls)
    assert len(peer.calls) <= 500
    assert max(peer.calls.values()) == 1, Counter(peer.calls.values())
    assert worker.poll() is None, procs.log(worker)


async def test_an_email_only_worker_sleeps_while_only_sms_work_is_due(
    db: Database, database_url: str, spawn
) -> None:
    poll_seconds = 1.0
    wire = await StatementCounter(database_url).start()
    try:
        procs = spawn(wire.url)
        worker = procs.start(
            *quick_flags("--channels", "email", "--poll-interval", str(poll_seconds))
        )
        await procs.ready(worker)
        service = notification_service(db)
        await service.enqueue_many(
            [new(channel=Channel.SMS, recipient=f"+4915{i:09d}") for i in range(20)]
            + [new(recipient="later@example.com", delay_seconds=3600)]
        )
        await asyncio.sleep(1)  # start-up and the first look are not what is counted
        before, started = wire.statements, time.monotonic()
        await asyncio.sleep(4)
        # The poll intervals the window overlaps: its length in intervals, plus one for the edges.
        issued = wire.statements - before
        polls = (time.monotonic() - started) / poll_seconds + 1
    finally:
        await wire.stop()
    # Counted, not timed: a busy machine slows a spinning worker down but never makes a sleeping
    # one ask more. Sleeping, the worker's tasks (claim, next due, housekeeping, outbox) issue
    # about 7 statements per poll interval (34 in a window of 4 s). Spinning (next_due_at without
    # the channel filter, so the due sms says "now" forever; tried by hand): 607 in 4 s on a
    # loaded 2-core machine, about 120 per interval. The bound sits a factor 3 to 6 from each.
    record("email-only worker, sms due", {"statements": issued, "poll_intervals": round(polls, 1)})
    assert issued <= 20 * polls, f"{issued} statements in {polls - 1:.1f} poll intervals"
    rows = await read_rows(
        db, "SELECT count(*) AS n FROM nq_all_notifications WHERE status='PENDING'"
    )
    assert rows[0]["n"] == 21


async def test_a_failing_background_task_is_restarted_and_shows_on_healthz(
    db: Database, database_url: str, spawn
) -> None:
    port = free_port()
    procs = spawn(database_url)
    worker = procs.start(*quick_flags("--metrics-port", str(port)))
    await procs.ready(worker)
    url = f"http://127.0.0.1:{port}/healthz"
    async with aiohttp.ClientSession() as http:

        async def health(expected: int, task: str = "complete") -> dict[str, Any] | None:
            async with http.get(url) as response:
                body: dict[str, Any] = await response.json()
                healthy = body["tasks"][task]["healthy"]
                return (
                    body if response.status == expected and healthy == (expected == 200) else None
                )

        await poll(lambda: health(200), timeout=10, what="healthy at start")
        # The fault: the function the completion statement calls disappears (as after a bad
        # manual change); recording results (and housekeeping, which calls it too) fails with an
        # error that is not a lost connection.
        # Created before the fault (creating can write events too), due just after it.
        ids = [await _send(db, f"during-{i}@example.com", delay_seconds=2) for i in range(3)]
        await _sql(
            db, "ALTER FUNCTION nq_insert_webhook_events RENAME TO nq_insert_webhook_events_away"
        )
        report = await poll(lambda: health(503), timeout=20, what="/healthz reports the failure")
        assert report["tasks"]["complete"]["healthy"] is False
        assert "nq_insert_webhook_events" in report["tasks"]["complete"]["lastError"]
        await _sql(
            db, "ALTER FUNCTION nq_insert_webhook_events_away RENAME TO nq_insert_webhook_events"
        )
        report = await poll(lambda: health(200), timeout=60, what="healthy after the restart")
        assert report["tasks"]["complete"]["restarts"] >= 1
    for id in ids:  # the results kept in memory were recorded once the completer recovered
        assert (await poll(lambda id=id: _final(db, id), timeout=30))["status"] == Status.SENT
    assert worker.poll() is None
    assert "Traceback" in procs.log(worker)  # logged with its traceback, not swallowed


async def _sql(db: Database, statement: str) -> None:
    async with await psycopg.AsyncConnection.connect(db.url, autocommit=True) as conn:
        await conn.execute(statement)  # type: ignore[arg-type]


async def test_the_operators_endpoints_are_trusted_and_client_urls_are_guarded(
    db: Database, database_url: str, peer: HostilePeer, spawn
) -> None:
    procs = spawn(database_url)
    worker = procs.start(
        *quick_flags(
            "--provider",
            "http",
            "--provider-url",
            f"{peer.base}/deliver",
            "--webhook-url",
            f"{peer.base}/operator",
        ),
        "--webhook-max-attempts",
        "1",
    )
    await procs.ready(worker)
    trusted = await _send(db, "plain@example.com")
    loopback = await _send(db, "a@example.com", webhook_url=f"{peer.base}/client")
    private = await _send(db, "b@example.com", webhook_url="http://10.0.0.1/client")
    for id in (trusted, loopback, private):
        assert (await poll(lambda id=id: _final(db, id), timeout=30))["status"] == Status.SENT

    async def events_final() -> list[dict[str, Any]] | None:
        rows = await read_rows(
            db, "SELECT notification_id, state, last_error FROM nq_webhook_events"
        )
        return (
            rows if rows and all(r["state"] != "pending" for r in rows) and len(rows) == 3 else None
        )

    rows = {r["notification_id"]: r for r in await poll(events_final, timeout=30)}
    assert rows[trusted]["state"] == "delivered"
    assert rows[loopback]["state"] == "failed" and "loopback" in rows[loopback]["last_error"]
    assert rows[private]["state"] == "failed" and "private" in rows[private]["last_error"]
    assert peer.paths == Counter({"operator": 1})  # nothing reached the client URL


async def test_with_dispatch_off_the_worker_posts_nothing_and_the_relay_role_posts_it_all(
    db: Database, database_url: str, peer: HostilePeer, spawn
) -> None:
    procs = spawn(database_url)
    worker = procs.start(
        *quick_flags("--webhook-url", f"{peer.base}/hooks"), "--webhook-dispatch", "off"
    )
    await procs.ready(worker)
    ids = [await _send(db, f"r-{i}@example.com") for i in range(10)]
    for id in ids:
        assert (await poll(lambda id=id: _final(db, id), timeout=30))["status"] == Status.SENT
    rows = await read_rows(db, "SELECT count(*) AS n FROM nq_webhook_events WHERE state='pending'")
    assert rows[0]["n"] == 10 and not peer.calls  # written to the outbox, not POSTed

    relay = procs.start_relay("--poll-interval", "0.2", "--webhook-url", f"{peer.base}/hooks")
    await poll(
        lambda: _delivered_count(db, 10),
        timeout=30,
        what="the relay delivered every event",
    )
    assert sorted(peer.calls.values()) == [1] * 10
    assert relay.poll() is None and "relay started" in procs.log(relay)


async def _delivered_count(db: Database, expected: int) -> bool:
    rows = await read_rows(
        db, "SELECT count(*) AS n FROM nq_webhook_events WHERE state='delivered'"
    )
    return bool(rows[0]["n"] == expected)


async def test_every_event_to_a_hanging_receiver_is_posted_even_past_a_hundred_in_flight(
    db: Database, database_url: str, peer: HostilePeer, spawn
) -> None:
    """More POSTs in flight than aiohttp's default pool of 100: none may time out waiting for a
    connection (never sent, yet failed), each must reach the receiver."""
    procs = spawn(database_url)
    worker = procs.start(
        *quick_flags("--webhook-url", f"{peer.base}/hooks"),
        "--webhook-timeout",
        "2",
        "--webhook-max-attempts",
        "1",
    )
    await procs.ready(worker)
    created = await notification_service(db).enqueue_many(
        [new(recipient=f"hang-{i}@example.com") for i in range(150)]
    )
    peer.hang_job_ids = {str(c.notification.id) for c in created}

    async def all_failed() -> bool:
        rows = await read_rows(
            db, "SELECT count(*) AS n FROM nq_webhook_events WHERE state = 'failed'"
        )
        return bool(rows[0]["n"] == 150)

    await poll(all_failed, timeout=60, what="150 events failed after hanging")
    assert len(peer.calls) == 150 and set(peer.calls.values()) == {1}
