"""An acknowledgement racing each step of an escalation, with a real worker loop (its claim and
completion SQL) delivering through the HTTP provider to a test gateway (docs/escalation.md,
"The race"): the scenario, run on plain PostgreSQL (tests/test_escalation_race.py) and on Citus
(tests/citus/test_escalation_race.py), each with its own negative control.

For each step i of [push at 0 s, sms at 1 s, voice at 2 s], one escalation is acknowledged while
step i's first attempt is in flight: the gateway holds that call until the acknowledgement has
committed (the API answered), then answers 503. The acknowledgement cannot cancel a PROCESSING
step, so step i goes back to PENDING with a backoff that ends *after* the acknowledgement
committed: it must not be sent. Every other step's first attempt is answered 503 at once and
its retry 200, so the steps before i go out before the acknowledgement (legal: they were due
before it) and the steps after i are cancelled by it. Without the guard, step i is sent after
the acknowledgement, every time: the race the guard closes.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import aiohttp
from aiohttp import web

from notify_queue.providers.http import HttpProvider
from tests.api.support import api_client
from tests.support import eventually, start_workers

STEPS = [
    {"channel": "push"},
    {"channel": "sms", "afterSeconds": 1},
    {"channel": "voice", "afterSeconds": 2},
]


class Gateway:
    """The HTTP provider's far end: 503 to every first attempt (the target step's held until
    its escalation is acknowledged), 200 to every later one; each answer recorded with the time
    it was given (this process's clock, as the acknowledgements' times)."""

    def __init__(self, targets: dict[str, asyncio.Event]) -> None:
        self.targets = targets  # notification id -> set once its escalation is acknowledged
        self.arrived: dict[str, asyncio.Event] = {i: asyncio.Event() for i in targets}
        self.attempts: dict[str, int] = {}
        self.answers: list[tuple[str, int, float]] = []  # (notification id, status, time)

    async def handle(self, request: web.Request) -> web.Response:
        id = (await request.json())["id"]
        self.attempts[id] = self.attempts.get(id, 0) + 1
        if self.attempts[id] > 1:
            self.answers.append((id, 200, time.monotonic()))
            return web.json_response({"messageId": f"m-{id}"})
        if id in self.targets:
            self.arrived[id].set()
            await self.targets[id].wait()
        self.answers.append((id, 503, time.monotonic()))
        return web.Response(status=503, text="try again")


async def no_step_is_sent_after_the_acknowledgement_committed(
    database_url: str, *, guarded: bool
) -> None:
    """The scenario on `database_url`, its schema migrated; `guarded` false: the database's claim
    has its guard removed (the negative control) and the race must show."""
    async with api_client(database_url) as http:
        user = "oncall"
        await http.put(
            f"/recipients/{user}", json={"phone": "+4915112345678", "pushTokens": ["device-1"]}
        )
        escalations: list[dict[str, Any]] = []
        for _ in STEPS:
            made = await http.post(
                "/notifications",
                json={"recipientId": user, "body": "db-1 is down", "escalation": {"steps": STEPS}},
                headers={"Idempotency-Key": uuid.uuid4().hex},
            )
            assert made.status_code == 201, made.text
            escalations.append(made.json())
        # Escalation i is acknowledged while its step i is in flight.
        targets = {e["notifications"][i]["id"]: asyncio.Event() for i, e in enumerate(escalations)}
        gateway = Gateway(targets)
        app = web.Application()
        app.router.add_post("/send", gateway.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        session = aiohttp.ClientSession()
        workers = await start_workers(
            database_url,
            HttpProvider(f"http://127.0.0.1:{port}/send", 10.0, session),
            backoff_base=0.1,
            backoff_max=0.3,
        )
        acknowledged_at: dict[str, float] = {}
        try:

            async def acknowledge(i: int, e: dict[str, Any]) -> None:
                target = e["notifications"][i]["id"]
                await asyncio.wait_for(gateway.arrived[target].wait(), timeout=60)
                answer = await http.post(f"/escalations/{e['escalation']['id']}/acknowledge")
                assert answer.status_code == 200, answer.text
                acknowledged_at[e["escalation"]["id"]] = time.monotonic()  # after the commit
                targets[target].set()

            await asyncio.gather(*(acknowledge(i, e) for i, e in enumerate(escalations)))

            async def settled() -> bool:
                for e in escalations:
                    got = (await http.get(f"/escalations/{e['escalation']['id']}")).json()
                    if any(n["status"] in ("PENDING", "PROCESSING") for n in got["notifications"]):
                        return False
                return True

            await eventually(settled, timeout=60)
        finally:
            await workers.stop()
            await session.close()
            await runner.cleanup()

        sent_after_ack = []
        for i, e in enumerate(escalations):
            got = (await http.get(f"/escalations/{e['escalation']['id']}")).json()
            assert got["state"] == "acknowledged"
            statuses = [n["status"] for n in got["notifications"]]
            ids = [n["id"] for n in got["notifications"]]
            # A step answered 200 whose first attempt failed after the acknowledgement committed
            # was due (its retry) after it: sent although acknowledged.
            for id in ids:
                failed = [t for n, s, t in gateway.answers if n == id and s == 503]
                sent = [t for n, s, t in gateway.answers if n == id and s == 200]
                if sent and failed and failed[0] > acknowledged_at[e["escalation"]["id"]]:
                    sent_after_ack.append((i, id))
            if guarded:
                # Step i and later: cancelled. The steps before i were due before the
                # acknowledgement: sent, or cancelled when a busy machine had not sent them yet.
                assert statuses[i:] == ["CANCELLED"] * (len(STEPS) - i), (i, got)
                assert set(statuses[:i]) <= {"SENT", "CANCELLED"}, (i, got)
                cancelled = [n for n in got["notifications"] if n["status"] == "CANCELLED"]
                assert {n["lastError"] for n in cancelled} == {"acknowledged"}
        if guarded:
            assert sent_after_ack == []
        else:
            # The race the guard closes: each in-flight step is sent after its acknowledgement.
            assert set(targets) <= {id for _, id in sent_after_ack}
