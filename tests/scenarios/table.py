"""The delivery scenarios both engines must play alike (one table, plain PostgreSQL and Citus).

Each scenario creates its rows (through the API or the repositories, as a user or the operator
would), drives them with the worker's own calls (`DeliveryService.claim` and `.complete`: the
claim and completion statements of the engine under test) and reads back what it came to: the
statuses, attempt counts and waiting reasons of its rows, what was handed out for sending. The
outcome it returns must equal the table's `expected`, on each engine: a rule written differently
on one engine fails that engine's run (tests/test_delivery_scenarios.py,
tests/citus/test_delivery_scenarios.py).

The scenarios of one engine share a database: each uses recipients, keys and policies of its own
(`Run.tag`), and first clears what an earlier one left unfinished, so no claim meets another
scenario's rows. Time moves by setting a row's due time (`Run.make_due`), never by sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from aiohttp import web

from notify_queue.models import (
    Channel,
    ChannelRateLimit,
    ClaimedNotification,
    DeliveryResult,
    Outcome,
    Policy,
    Priority,
)
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery import ChainHeads, DeliveryRepository
from notify_queue.repositories.policies import PolicyRepository
from notify_queue.repositories.providers import ProviderRepository
from notify_queue.services.delivery import DeliveryService
from notify_queue.services.preferences import system_clock
from tests.api.support import sql
from tests.support import defaults, eventually, new, notification_service

SENT = DeliveryResult(Outcome.SENT)
TEMPORARY = DeliveryResult(Outcome.TEMPORARY_FAILURE, error="503 try again")


@dataclass
class Run:
    """One scenario's run on one engine: its database, the API on it, and a tag of its own."""

    url: str
    db: Database
    http: httpx.AsyncClient
    tag: str

    def recipient(self, name: str = "r") -> str:
        return f"{name}-{self.tag}@example.com"

    def worker(self, clock: datetime | None = None, **overrides: Any) -> DeliveryService:
        """The worker's delivery service (its claim and completion); `clock` freezes the
        moment quiet hours are judged at (the claim runs on the database's clock)."""
        return DeliveryService(
            DeliveryRepository(self.db, defaults(**overrides)),
            priorities=list(Priority),
            channels=list(Channel),
            clock=(lambda: clock) if clock is not None else system_clock,
        )

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        response = await self.http.post(
            "/notifications", json=body, headers={"Idempotency-Key": uuid.uuid4().hex}
        )
        assert response.status_code == 201, response.text
        made: dict[str, Any] = response.json()
        return made

    async def row(self, id: object) -> dict[str, Any]:
        """What a reader sees of one notification: the API's answer."""
        response = await self.http.get(f"/notifications/{id}")
        assert response.status_code == 200, response.text
        found: dict[str, Any] = response.json()
        return found

    async def state(self, id: object) -> tuple[Any, ...]:
        """(status, attempts, waiting reason or None)."""
        found = await self.row(id)
        waiting = found.get("waiting") or {}
        return found["status"], found["attemptCount"], waiting.get("reason")

    async def make_due(self, id: object) -> None:
        """Time travel instead of a wait: the row's next attempt, now."""
        await sql(self.url, "UPDATE nq_jobs SET next_attempt_at = now() WHERE id = %s", (str(id),))


async def _ids(claimed: list[ClaimedNotification]) -> list[str]:
    return sorted(str(c.id) for c in claimed)


async def recipient_rate_limit(run: Run) -> dict[str, Any]:
    """Four to one recipient under a limit of three an hour: three go, the fourth waits for the
    oldest place to free, without using an attempt; another recipient is not slowed. A fifth,
    created once the three were sent, waits too: their places stay in the window."""
    made = await notification_service(run.db).enqueue_many(
        [new(recipient=run.recipient()) for _ in range(4)] + [new(recipient=run.recipient("o"))]
    )
    worker = run.worker(rate_limit=3)
    batch = await worker.claim(10)
    await worker.complete([(c, SENT) for c in batch.claimed])
    # One more, after those were sent: the window still holds their three places.
    made += await notification_service(run.db).enqueue_many([new(recipient=run.recipient())])
    later = await worker.claim(10)
    states = [await run.state(m.notification.id) for m in made]
    waiting = [await run.row(m.notification.id) for m in made]
    due = [
        datetime.fromisoformat(w["nextAttemptAt"]) - datetime.now(UTC)
        for w in waiting
        if w["status"] == "PENDING"
    ]
    return {
        "claimed": len(batch.claimed),
        "rate limited": len(batch.rate_limited),
        "claimed later": len(later.claimed),
        "states": sorted(states),
        "due in about an hour": [timedelta(minutes=55) < d <= timedelta(hours=1) for d in due],
    }


async def policy_rate_limit(run: Run) -> dict[str, Any]:
    """A policy's limit (one a minute) overrides the worker's default (a hundred)."""
    name = f"team/strict-{run.tag}"
    await PolicyRepository(run.db).policy_upsert(
        policy=Policy(name=name, rate_limit=1, rate_window_seconds=60)
    )
    made = await notification_service(run.db).enqueue_many(
        [new(recipient=run.recipient(), policy=name) for _ in range(3)]
    )
    batch = await run.worker(rate_limit=100).claim(10)
    return {
        "claimed": len(batch.claimed),
        "rate limited": len(batch.rate_limited),
        "states": sorted([await run.state(m.notification.id) for m in made]),
    }


async def channel_rate_limit(run: Run) -> dict[str, Any]:
    """A policy's sms limit (two a minute) spaces one number's texts while its calls flow (the
    recipient-wide limit, a hundred, is far off): the third sms waits for the first sms's place,
    no attempt used; the calls are not held back by the full sms window."""
    name = f"team/texts-{run.tag}"
    await PolicyRepository(run.db).policy_upsert(
        policy=Policy(
            name=name,
            rate_limit=100,
            rate_window_seconds=3600,
            channel_rate_limits={"sms": ChannelRateLimit(2, 60)},
        )
    )
    phone = "+1555" + str(int(run.tag, 16) % 10_000_000).zfill(7)
    texts = await notification_service(run.db).enqueue_many(
        [new(channel=Channel.SMS, recipient=phone, policy=name) for _ in range(3)]
    )
    worker = run.worker(rate_limit=100)
    first = await worker.claim(10)
    await worker.complete([(c, SENT) for c in first.claimed])
    # The same number's calls after its sms window filled: not limited by it.
    calls = await notification_service(run.db).enqueue_many(
        [new(channel=Channel.VOICE, recipient=phone, policy=name) for _ in range(2)]
    )
    second = await worker.claim(10)
    waiting = await run.row(texts[2].notification.id)
    due = datetime.fromisoformat(waiting["nextAttemptAt"]) - datetime.now(UTC)
    return {
        "sms claimed": len(first.claimed),
        "rate limited": len(first.rate_limited),
        "calls claimed": sorted(c.channel.value for c in second.claimed),
        "sms states": sorted([await run.state(t.notification.id) for t in texts]),
        "detail": waiting["waiting"]["detail"],
        "due in about a minute": timedelta(seconds=50) < due <= timedelta(minutes=1),
        "call states": [(await run.state(m.notification.id))[:2] for m in calls],
    }


async def aging(run: Run) -> dict[str, Any]:
    """Under a steady stream of HIGH (always more due than a batch takes), strict priority
    never reaches a LOW; with aging (600 s) a LOW due for 21 minutes ranks with HIGH and, older
    than every HIGH, goes first, while a NORMAL due for 5 minutes still waits. Due times are set,
    not waited for."""
    service = notification_service(run.db)
    highs = await service.enqueue_many(
        [new(recipient=run.recipient(f"h{i}"), priority=Priority.HIGH) for i in range(5)]
    )
    low = await service.enqueue(new(recipient=run.recipient("low"), priority=Priority.LOW))
    normal = await service.enqueue(new(recipient=run.recipient("n"), priority=Priority.NORMAL))
    for made, waited in [(low, 1260), (normal, 300), *((h, 60) for h in highs)]:
        await sql(
            run.url,
            "UPDATE nq_jobs SET next_attempt_at = now() - make_interval(secs => %s) WHERE id = %s",
            (waited, str(made.notification.id)),
        )
    strict = await run.worker(aging_seconds=0).claim(2)
    aged = await run.worker(aging_seconds=600).claim(2)
    return {
        "strict": [c.priority.name for c in strict.claimed],
        "aged": sorted(c.priority.name for c in aged.claimed),
        "normal": (await run.state(normal.notification.id))[:2],
    }


async def fair_share(run: Run) -> dict[str, Any]:
    """Tenant A's backlog (20 due for a minute) and tenant B's 3 (due a second ago) in one lane
    (one recipient, so one bucket on Citus): a claim of 8 interleaves the tenants, so B's three
    go in the first round instead of after A's backlog."""
    service = notification_service(run.db)
    to = run.recipient()
    a = await service.enqueue_many(
        [dataclasses.replace(new(recipient=to), tenant=f"a-{run.tag}") for _ in range(20)]
    )
    b = await service.enqueue_many(
        [dataclasses.replace(new(recipient=to), tenant=f"b-{run.tag}") for _ in range(3)]
    )
    for made, waited in [*((m, 60) for m in a), *((m, 1) for m in b)]:
        await sql(
            run.url,
            "UPDATE nq_jobs SET next_attempt_at = now() - make_interval(secs => %s) WHERE id = %s",
            (waited, str(made.notification.id)),
        )
    first = {c.id for c in (await run.worker(rate_limit=100).claim(8)).claimed}
    return {
        "A in the first claim": sum(m.notification.id in first for m in a),
        "B in the first claim": sum(m.notification.id in first for m in b),
    }


async def policy_not_ready(run: Run) -> dict[str, Any]:
    """A notification of a policy that is not Ready is held (no attempt, no place in its
    recipient's window) until the policy is Ready and the operator releases it."""
    name = f"shop/held-{run.tag}"
    policies = PolicyRepository(run.db)
    await policies.policy_upsert(policy=Policy(name=name), ready=False)
    service = notification_service(run.db)
    held = await service.enqueue(new(recipient=run.recipient(), policy=name))
    free = await service.enqueue(new(recipient=run.recipient()))
    worker = run.worker(rate_limit=1)
    first = await worker.claim(10)
    while_held = await run.state(held.notification.id)
    await run.make_due(held.notification.id)
    again = await worker.claim(10)
    await worker.complete([(c, SENT) for c in first.claimed])
    await policies.policy_upsert(policy=Policy(name=name, rate_limit=5), ready=True)
    released = await policies.policy_release_held(name=name)
    after = await worker.claim(10)
    return {
        "first claim": [str(c.id) for c in first.claimed] == [str(free.notification.id)],
        "rate limited": len(first.rate_limited),
        "held": while_held,
        "claimed while still not ready": len(again.claimed),
        "released": released,
        "claimed once ready": [(str(c.id), c.attempt_count) for c in after.claimed]
        == [(str(held.notification.id), 1)],
    }


async def quiet_hours(run: Run) -> dict[str, Any]:
    """At 23:00 in the recipient's timezone, inside quiet hours 22:00-07:00: a NORMAL
    notification waits for 07:00 there without using an attempt; a HIGH one goes out."""
    user = f"u-{run.tag}"
    response = await run.http.put(
        f"/recipients/{user}",
        json={
            "email": run.recipient(),
            "timezone": "Europe/Berlin",
            "preferences": {"quietHours": {"start": "22:00", "end": "07:00"}},
        },
    )
    assert response.status_code in (200, 201), response.text
    normal = await run.create({"recipientId": user, "channels": ["email"], "body": "hi"})
    high = await run.create(
        {"recipientId": user, "channels": ["email"], "body": "hi", "priority": "HIGH"}
    )
    [normal_id] = [n["id"] for n in normal["notifications"]]
    [high_id] = [n["id"] for n in high["notifications"]]
    # 23:00 in Berlin, on a night ahead of the database's clock, so the deferral is still ahead.
    night = datetime(2099, 1, 15, 22, 0, tzinfo=UTC)
    worker = run.worker(clock=night)
    batch = await worker.claim(10)
    stored = await run.row(normal_id)
    return {
        "claimed": [str(c.id) for c in batch.claimed] == [high_id],
        "normal": await run.state(normal_id),
        "due at seven there": datetime.fromisoformat(stored["nextAttemptAt"])
        == datetime(2099, 1, 16, 6, 0, tzinfo=UTC),
    }


async def retries_with_backoff(run: Run) -> dict[str, Any]:
    """Two temporary failures of a notification allowed two attempts: the first waits its
    backoff (base 10 s: the first retry waits 10 to 20 s), the second dead-letters it with the
    last error."""
    [made] = await notification_service(run.db, max_attempts=2).enqueue_many(
        [new(recipient=run.recipient())]
    )
    id = made.notification.id
    worker = run.worker(backoff_base_seconds=10.0, backoff_max_seconds=60.0)
    first = await worker.claim(10)
    await worker.complete([(c, TEMPORARY) for c in first.claimed])
    after_first = await run.state(id)
    due = datetime.fromisoformat((await run.row(id))["nextAttemptAt"]) - datetime.now(UTC)
    early = await worker.claim(10)
    await run.make_due(id)
    second = await worker.claim(10)
    await worker.complete([(c, TEMPORARY) for c in second.claimed])
    final = await run.row(id)
    return {
        "after the first": after_first,
        "backoff": timedelta(seconds=5) < due <= timedelta(seconds=20),
        "claimed before its backoff ended": len(early.claimed),
        "second attempt": [c.attempt_count for c in second.claimed],
        "final": (final["status"], final["attemptCount"], final["lastError"]),
    }


async def expiry(run: Run) -> dict[str, Any]:
    """A notification whose expiry passed before it was sent ends EXPIRED, never handed out,
    without an attempt; the one beside it, not expired, goes out."""
    service = notification_service(run.db)
    late = await service.enqueue(
        new(recipient=run.recipient(), expires_at=datetime.now(UTC) + timedelta(hours=1))
    )
    timely = await service.enqueue(new(recipient=run.recipient()))
    await sql(
        run.url,
        "UPDATE nq_jobs SET expires_at = now() - interval '1 second' WHERE id = %s",
        (str(late.notification.id),),
    )
    worker = run.worker()
    batch = await worker.claim(10)
    await worker.housekeeping()
    return {
        "claimed": [str(c.id) for c in batch.claimed] == [str(timely.notification.id)],
        "expired": (await run.state(late.notification.id))[:2],
    }


async def digest(run: Run) -> dict[str, Any]:
    """Two items under one key, `maxItems` two: the digest closes at once and goes out as one
    message (its carrier) carrying both; once sent, both items are SENT."""
    recipient = run.recipient()
    spec = {"key": f"likes-{run.tag}", "windowSeconds": 900, "maxItems": 2}
    items = [
        await run.create(
            {"channel": "email", "recipient": recipient, "body": f"like {i}", "digest": spec}
        )
        for i in range(2)
    ]
    worker = run.worker()
    batch = await worker.claim(10)
    await worker.complete([(c, SENT) for c in batch.claimed])
    return {
        "messages": len(batch.claimed),
        "carries": [c.metadata["digest"]["count"] for c in batch.claimed],
        "items": [(await run.state(i["id"]))[:2] for i in items],
    }


async def escalation_guard(run: Run) -> dict[str, Any]:
    """A step in flight when its escalation is acknowledged fails temporarily and is due again:
    the claim cancels it (`acknowledged`) instead of sending it; the later step is cancelled by
    the acknowledgement itself."""
    user = f"oncall-{run.tag}"
    await run.http.put(
        f"/recipients/{user}", json={"phone": "+4915112345678", "pushTokens": ["device-1"]}
    )
    steps = [{"channel": "push"}, {"channel": "sms", "afterSeconds": 60}]
    made = await run.create(
        {"recipientId": user, "body": "db down", "escalation": {"steps": steps}}
    )
    first_id = made["notifications"][0]["id"]
    worker = run.worker(backoff_base_seconds=0.0, backoff_max_seconds=0.0)
    in_flight = await worker.claim(10)
    answer = await run.http.post(f"/escalations/{made['escalation']['id']}/acknowledge")
    assert answer.status_code == 200, answer.text
    await worker.complete([(c, TEMPORARY) for c in in_flight.claimed])
    await run.make_due(first_id)
    again = await worker.claim(10)
    got = (await run.http.get(f"/escalations/{made['escalation']['id']}")).json()
    return {
        "in flight": [str(c.id) for c in in_flight.claimed] == [first_id],
        "claimed after the acknowledgement": len(again.claimed),
        "steps": [(n["status"], n["lastError"]) for n in got["notifications"]],
    }


HEADS = ChainHeads({Channel.EMAIL: "a", Channel.SMS: "a", Channel.PUSH: "a"}, ("a", "b"))


async def failover_binding(run: Run) -> dict[str, Any]:
    """The claim binds a row to its chain's head; a timeout at that provider (the outcome
    unknown) keeps it bound there, sticky, for the retry; an answer proving nothing was sent
    frees it again."""
    [made] = await notification_service(run.db).enqueue_many([new(recipient=run.recipient())])
    worker = run.worker(backoff_base_seconds=0.0, backoff_max_seconds=0.0)
    seen = []
    for bound_by_result in ("a", None, None):
        [claimed] = (await worker.claim(10, chain_heads=HEADS)).claimed
        seen.append((claimed.bound_provider, claimed.sticky_provider))
        result = DeliveryResult(
            Outcome.TEMPORARY_FAILURE, error="timeout", bound_provider=bound_by_result
        )
        await worker.complete([(claimed, result)])
        await run.make_due(made.notification.id)
    return {"claims": seen, "after": (await run.state(made.notification.id))[:2]}


async def lost_lease(run: Run) -> dict[str, Any]:
    """A worker that dies during its call to provider b: the lease runs out, housekeeping puts
    the row back, and the next claim takes it again, still bound to b (b may have sent it) and
    on the place in its recipient's window the lost attempt took (a limit of one)."""
    await notification_service(run.db).enqueue_many([new(recipient=run.recipient())])
    worker = run.worker(lease_seconds=0.0, rate_limit=1)
    [claimed] = (await worker.claim(10, chain_heads=HEADS)).claimed
    rebound = await ProviderRepository(run.db).notification_bind_provider(
        id=claimed.id, claim_token=claimed.claim_token, provider="b"
    )
    recovered, _, _ = await worker.housekeeping()
    again = await worker.claim(10, chain_heads=HEADS)
    return {
        "rebound": rebound,
        "recovered": recovered,
        "claimed again": [(c.attempt_count, c.sticky_provider) for c in again.claimed],
        "rate limited": len(again.rate_limited),
    }


class FlakyGateway:
    """An HTTP provider on loopback: 503 to each message's first call (unless `flaky` is
    false), 200 to every later one; the calls it got, by message id."""

    def __init__(self, *, flaky: bool = True) -> None:
        self.calls: dict[str, list[int]] = {}
        self.url = ""
        self._flaky = flaky
        self._runner: web.AppRunner | None = None

    async def _send(self, request: web.Request) -> web.Response:
        id = (await request.json())["id"]
        answers = self.calls.setdefault(id, [])
        answers.append(503 if not answers and self._flaky else 200)
        if answers[-1] == 503:
            return web.Response(status=503, text="try again")
        return web.json_response({"messageId": f"m-{id}"})

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[FlakyGateway]:
        app = web.Application()
        app.router.add_post("/send", self._send)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/send"
        try:
            yield self
        finally:
            await self._runner.cleanup()


@contextlib.asynccontextmanager
async def worker_process(url: str, provider_url: str) -> AsyncIterator[subprocess.Popen[bytes]]:
    """One `notify-queue worker` on `url` delivering through the HTTP provider at
    `provider_url`, with a short backoff; stopped by SIGTERM, as Kubernetes stops it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFY_QUEUE_")}
    command = [sys.executable, "-m", "notify_queue", "worker", "--database-url", url]
    command += ["--provider", "http", "--provider-url", provider_url, "--rate-limit", "1000"]
    command += ["--poll-interval", "0.2", "--backoff-base", "0.05", "--backoff-max", "0.2"]
    command += ["--log-level", "WARNING"]
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield process
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(process.wait, 60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.seek(0)
            assert process.returncode == 0, log.read().decode()[-3000:]


async def through_the_worker_process(run: Run) -> dict[str, Any]:
    """The real `notify-queue worker` process: each message's first call answered 503 is
    retried after its backoff and sent by the second; the provider got each message twice, its
    one 200 the last."""
    made = [
        await run.create({"channel": "email", "recipient": run.recipient(), "body": f"n{i}"})
        for i in range(3)
    ]
    ids = [m["id"] for m in made]

    async def sent() -> bool:
        for id in ids:
            assert process.poll() is None, "the worker stopped"
            if (await run.row(id))["status"] != "SENT":
                return False
        return True

    async with FlakyGateway().running() as gateway:
        async with worker_process(run.url, gateway.url) as process:
            await eventually(sent, timeout=60, what="every notification SENT")
    return {
        "states": [(await run.state(id))[:2] for id in ids],
        "calls": [gateway.calls.get(id) for id in ids],
    }


async def channel_limit_through_the_worker_process(run: Run) -> dict[str, Any]:
    """The real `notify-queue worker` process and API: a policy's sms limit (two a minute) holds
    the third text to one number back while that number's two calls go out."""
    name = f"team/spaced-{run.tag}"
    await PolicyRepository(run.db).policy_upsert(
        policy=Policy(name=name, channel_rate_limits={"sms": ChannelRateLimit(2, 60)})
    )
    phone = "+1555" + str(int(run.tag, 16) % 10_000_000).zfill(7)
    texts = [
        (await run.create({"channel": "sms", "recipient": phone, "body": f"t{i}", "policy": name}))[
            "id"
        ]
        for i in range(3)
    ]
    calls = [
        (await run.create({"channel": "voice", "recipient": phone, "body": "m", "policy": name}))[
            "id"
        ]
        for _ in range(2)
    ]

    async def settled() -> bool:
        assert process.poll() is None, "the worker stopped"
        states = [await run.state(id) for id in texts + calls]
        return (
            states.count(("SENT", 1, None)) == 4
            and (
                "PENDING",
                0,
                "RecipientRateLimit",
            )
            in states
        )

    async with FlakyGateway(flaky=False).running() as gateway:
        async with worker_process(run.url, gateway.url) as process:
            await eventually(settled, timeout=60, what="four SENT, one text waiting")
    return {
        "texts": sorted([await run.state(id) for id in texts]),
        "calls": [await run.state(id) for id in calls],
    }


@dataclass(frozen=True)
class Scenario:
    name: str
    run: Callable[[Run], Awaitable[dict[str, Any]]]
    expected: dict[str, Any]


PENDING_NO_ATTEMPT = ("PENDING", 0)

SCENARIOS = [
    Scenario(
        "a recipient over its rate limit waits for the oldest slot",
        recipient_rate_limit,
        {
            "claimed": 4,
            "rate limited": 1,
            "claimed later": 0,
            "states": [("PENDING", 0, "RecipientRateLimit")] * 2 + [("SENT", 1, None)] * 4,
            "due in about an hour": [True, True],
        },
    ),
    Scenario(
        "a policy's rate limit overrides the default",
        policy_rate_limit,
        {
            "claimed": 1,
            "rate limited": 2,
            "states": [("PENDING", 0, "RecipientRateLimit")] * 2 + [("PROCESSING", 1, None)],
        },
    ),
    Scenario(
        "a policy's per-channel limit spaces sms while calls flow",
        channel_rate_limit,
        {
            "sms claimed": 2,
            "rate limited": 1,
            "calls claimed": ["voice", "voice"],
            "sms states": [("PENDING", 0, "RecipientRateLimit")] + [("SENT", 1, None)] * 2,
            "detail": "recipient reached 2 sms per 60 s",
            "due in about a minute": True,
            "call states": [("PROCESSING", 1)] * 2,
        },
    ),
    Scenario(
        "aging lets a LOW through a steady stream of HIGH",
        aging,
        {"strict": ["HIGH", "HIGH"], "aged": ["HIGH", "LOW"], "normal": ("PENDING", 0)},
    ),
    Scenario(
        "fair share: a tenant's backlog does not hold another tenant back",
        fair_share,
        {"A in the first claim": 5, "B in the first claim": 3},
    ),
    Scenario(
        "a policy that is not Ready holds its notifications",
        policy_not_ready,
        {
            "first claim": True,
            "rate limited": 0,
            "held": ("PENDING", 0, "PolicyNotReady"),
            "claimed while still not ready": 0,
            "released": 1,
            "claimed once ready": True,
        },
    ),
    Scenario(
        "quiet hours defer a NORMAL notification, not a HIGH one",
        quiet_hours,
        {"claimed": True, "normal": ("PENDING", 0, "QuietHours"), "due at seven there": True},
    ),
    Scenario(
        "temporary failures back off, then dead-letter at max attempts",
        retries_with_backoff,
        {
            "after the first": ("PENDING", 1, "Backoff"),
            "backoff": True,
            "claimed before its backoff ended": 0,
            "second attempt": [2],
            "final": ("DEAD_LETTERED", 2, "503 try again"),
        },
    ),
    Scenario(
        "an expired notification is never sent",
        expiry,
        {"claimed": True, "expired": ("EXPIRED", 0)},
    ),
    Scenario(
        "a full digest goes out as one message",
        digest,
        {"messages": 1, "carries": [2], "items": [("SENT", 1), ("SENT", 1)]},
    ),
    Scenario(
        "the escalation guard cancels a step acknowledged while in flight",
        escalation_guard,
        {
            "in flight": True,
            "claimed after the acknowledgement": 0,
            "steps": [("CANCELLED", "acknowledged"), ("CANCELLED", "acknowledged")],
        },
    ),
    Scenario(
        "the failover binding is sticky after an unknown outcome",
        failover_binding,
        {"claims": [("a", None), ("a", "a"), ("a", None)], "after": ("PENDING", 3)},
    ),
    Scenario(
        "a lost lease is recovered, keeping its binding and its window place",
        lost_lease,
        {"rebound": True, "recovered": 1, "claimed again": [(2, "b")], "rate limited": 0},
    ),
    Scenario(
        "a real worker process spaces sms by a policy's channel limit while calls flow",
        channel_limit_through_the_worker_process,
        {
            "texts": [("PENDING", 0, "RecipientRateLimit")] + [("SENT", 1, None)] * 2,
            "calls": [("SENT", 1, None)] * 2,
        },
    ),
    Scenario(
        "a real worker process retries a temporary failure and sends",
        through_the_worker_process,
        {"states": [("SENT", 2)] * 3, "calls": [[503, 200]] * 3},
    ),
]


async def clear_unfinished(url: str) -> None:
    """Earlier scenarios' unfinished rows out of the way: no claim meets them."""
    await sql(url, "DELETE FROM nq_jobs WHERE status IN ('PENDING', 'PROCESSING')")


async def play(
    url: str, db: Database, http: httpx.AsyncClient, scenario: Scenario
) -> dict[str, Any]:
    """The scenario's outcome on the database at `url` (the caller compares it with the table's)."""
    await clear_unfinished(url)
    return await scenario.run(Run(url, db, http, uuid.uuid4().hex[:10]))
