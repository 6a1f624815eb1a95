"""A webhook event written by any process reaches an idle relay at once (docs/design.md,
"Wake-ups and scheduling").

The relay is a real `notify-queue worker` (or `notify-queue relay`) process with --poll-interval
60, so its looks are a minute apart, and a real receiver; each test waits until the relay is idle
(it POSTed a warm-up event written before it started, its LISTEN connection is in place) and
only then writes an event
from somewhere else: the API (a recipient opted out at creation), `notify_queue_enqueue` in a
caller's transaction, and another worker's expiry. The event must arrive well before the relay's
next look could have found it: only the NOTIFY at the writer's commit can bring it in time.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg
from psycopg.types.json import Jsonb

from tests.receivers import WebhookReceiver
from tests.support import eventually, running_api

# The relay's looks are this far apart: an event that arrives within ARRIVAL_SECONDS of its
# commit was brought by the NOTIFY, never by a look.
LOOK_SECONDS = 60
# A deadline well above the 1 s an event takes (startup and load leave room), well below a look.
ARRIVAL_SECONDS = 15.0


@contextlib.contextmanager
def role(database_url: str, log: Path, *args: str) -> Iterator[None]:
    """`notify-queue <args>` as a subprocess, stopped with SIGTERM."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFY_QUEUE_")}
    command = [sys.executable, "-m", "notify_queue", *args, "--database-url", database_url]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*command, "--log-level", "WARNING"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            yield
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def warm_up(database_url: str, hooks: WebhookReceiver) -> None:
    """An event due now, written before the relay starts: its first look POSTs it."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO nq_webhook_events (id, notification_id, url, payload, bucket)"
            " VALUES (gen_random_uuid(), gen_random_uuid(), %s, %s, 0)",
            [hooks.url, json.dumps({"status": "WARM-UP"})],
        )


async def relay_idle(database_url: str, hooks: WebhookReceiver) -> None:
    """Until the relay has made its first look (it POSTed the warm-up event) and a worker's or
    relay's LISTEN connection is in place (not the operator's, on the status outbox). The
    warm-up's lease (2 x --webhook-timeout + 5 s) is longer than a look: the relay's next look
    is LOOK_SECONDS away."""

    async def listening() -> bool:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE application_name LIKE 'notify-queue-listen%' AND query LIKE 'LISTEN nq_w%'"
            )
            row = await cur.fetchone()
            return bool(row and row[0] >= 1)

    async def warmed_up() -> bool:
        return hooks.arrived.is_set()

    await eventually(warmed_up, timeout=120, what="the warm-up event")
    await eventually(listening, timeout=120, what="a LISTEN connection")


async def arrives(hooks: WebhookReceiver, status: str, written_at: float) -> None:
    """The event of `status` reaches the receiver before the relay's next look could."""

    async def received() -> bool:
        return any(r.json["status"] == status for r in hooks.received)

    await eventually(received, timeout=ARRIVAL_SECONDS, what=f"the {status} event")
    assert time.monotonic() - written_at < LOOK_SECONDS


def relay_args(hooks: WebhookReceiver) -> tuple[str, ...]:
    """A relay's looks LOOK_SECONDS apart, and the warm-up's lease longer than that."""
    looks = ("--poll-interval", str(LOOK_SECONDS), "--webhook-timeout", str(LOOK_SECONDS))
    return (*looks, "--webhook-url", hooks.url)


def worker_args(hooks: WebhookReceiver, *extra: str) -> tuple[str, ...]:
    return ("worker", *relay_args(hooks), *extra)


async def test_an_event_written_by_the_api_reaches_an_idle_worker(
    database_url: str, tmp_path: Path
) -> None:
    hooks = await WebhookReceiver().start()
    try:
        await warm_up(database_url, hooks)
        with role(database_url, tmp_path / "worker.log", *worker_args(hooks)):
            async with running_api(
                database_url, tmp_path / "api.log", "--webhook-url", hooks.url
            ) as url:
                await relay_idle(database_url, hooks)
                async with httpx.AsyncClient(base_url=url) as http:
                    put = await http.put(
                        "/recipients/alice",
                        json={
                            "email": "alice@example.com",
                            "preferences": {"optOut": {"all": True}},
                        },
                    )
                    assert put.status_code in (200, 201), put.text
                    created = await http.post(
                        "/notifications",
                        json={"recipientId": "alice", "channels": ["email"], "body": "hi"},
                        headers={"Idempotency-Key": uuid.uuid4().hex},
                    )
                    written_at = time.monotonic()
                assert created.status_code == 201, created.text
                [notification] = created.json()["notifications"]
                assert notification["status"] == "SUPPRESSED"
                await arrives(hooks, "SUPPRESSED", written_at)
    finally:
        await hooks.stop()


async def test_an_event_written_by_enqueue_in_a_callers_transaction_reaches_an_idle_worker(
    database_url: str, tmp_path: Path
) -> None:
    hooks = await WebhookReceiver().start()
    try:
        await warm_up(database_url, hooks)
        with role(database_url, tmp_path / "worker.log", *worker_args(hooks)):
            await relay_idle(database_url, hooks)
            async with await psycopg.AsyncConnection.connect(database_url) as app:
                await app.execute(
                    "INSERT INTO nq_recipients (id, email, opt_out_all)"
                    " VALUES ('bob', 'bob@example.com', true)"
                )
                # The deployment's default webhook, as `migrate --webhook-url` writes it.
                await app.execute("UPDATE nq_enqueue_defaults SET webhook_url = %s", [hooks.url])
                cur = await app.execute(
                    "SELECT notify_queue_enqueue(%s, %s)",
                    [Jsonb({"recipientId": "bob", "channels": ["email"], "body": "hi"}), "k-1"],
                )
                answer = await cur.fetchone()
                await app.commit()
                written_at = time.monotonic()
            assert answer is not None
            assert "SUPPRESSED" in str(answer[0])
            await arrives(hooks, "SUPPRESSED", written_at)
    finally:
        await hooks.stop()


async def test_an_event_written_by_another_workers_expiry_reaches_an_idle_relay(
    database_url: str, tmp_path: Path
) -> None:
    """The relay alone (`notify-queue relay`); the expiry is a worker's that relays nothing and
    serves email only, so the sms notification stays PENDING until it expires. The red run on
    the old code: the relay looked only every --poll-interval."""
    hooks = await WebhookReceiver().start()
    try:
        relay = ("relay", *relay_args(hooks))
        # Its own --poll-interval (1 s): housekeeping runs at most once per poll interval.
        expirer = ("worker", "--webhook-url", hooks.url, "--webhook-dispatch", "off")
        expirer += ("--channels", "email")
        await warm_up(database_url, hooks)
        with (
            role(database_url, tmp_path / "relay.log", *relay),
            role(database_url, tmp_path / "worker.log", *expirer),
        ):
            async with running_api(
                database_url, tmp_path / "api.log", "--webhook-url", hooks.url
            ) as url:
                await relay_idle(database_url, hooks)
                expires_at = datetime.now(UTC) + timedelta(seconds=2)
                async with httpx.AsyncClient(base_url=url) as http:
                    created = await http.post(
                        "/notifications",
                        json={
                            "channel": "sms",
                            "recipient": "+15550100",
                            "body": "code 1234",
                            "expiresAt": expires_at.isoformat().replace("+00:00", "Z"),
                        },
                        headers={"Idempotency-Key": uuid.uuid4().hex},
                    )
                assert created.status_code == 201, created.text
                written_at = time.monotonic() + 2
                await arrives(hooks, "EXPIRED", written_at)
    finally:
        await hooks.stop()
