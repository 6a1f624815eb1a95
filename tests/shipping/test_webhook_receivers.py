"""The webhook receivers of docs/webhooks.md, run as written, accept the events a real worker
signs and refuse forged or replayed ones.

Each receiver block (marked `<!-- webhooks: receiver <language> -->`) is written to a file and
started as its own process (`python`, or `node` when it is on PATH) with the page's variables,
`WEBHOOK_SECRET` and `PORT`. A worker signs with two secrets, as during a rotation, the second
being the receiver's; the event the receiver prints must be the one stored. Then the test posts
to it directly: a body changed after signing, a wrong secret and a timestamp ten minutes old
are each refused with 401.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from notify_queue.providers.simulated import SimulatedProvider
from notify_queue.repositories.db import Database
from tests.shipping.support import ROOT
from tests.support import eventually, free_port, new, notification_service, start_workers

PAGE = ROOT / "docs" / "webhooks.md"
_BLOCK = re.compile(r"<!-- webhooks: receiver (\w+) -->\s*\n```\w*\n(.*?)\n```", re.S)
SECRET = "whsec_" + base64.b64encode(b"the-receivers-secret-32-bytes-ok").decode()
OLD_SECRET = "whsec_" + base64.b64encode(b"a-secret-the-receiver-never-saw!").decode()
RUNTIMES = {"python": [sys.executable], "node": ["node"]}
SUFFIXES = {"python": ".py", "node": ".js"}


def receivers() -> dict[str, str]:
    return dict(_BLOCK.findall(PAGE.read_text()))


def test_the_page_has_a_python_and_a_node_receiver() -> None:
    assert set(receivers()) == {"python", "node"}


@pytest.fixture(params=["python", "node"])
def receiver(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    language = request.param
    if shutil.which(RUNTIMES[language][0]) is None:
        pytest.skip(f"{RUNTIMES[language][0]} is not on PATH")
    source = tmp_path / f"receiver{SUFFIXES[language]}"
    source.write_text(receivers()[language] + "\n")
    port = free_port()
    process = subprocess.Popen(
        [*RUNTIMES[language], str(source)],
        env=os.environ | {"WEBHOOK_SECRET": SECRET, "PORT": str(port)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, process.communicate()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the receiver never listened"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/notify-queue/events", process
    finally:
        process.kill()
        process.wait()


def _signed(secret: str, event_id: str, stamp: int, body: bytes) -> str:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    digest = hmac.new(key, f"{event_id}.{stamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


async def test_a_receiver_accepts_the_workers_event_and_refuses_forgeries(
    receiver: tuple[str, subprocess.Popen[str]], db: Database, database_url: str
) -> None:
    url, process = receiver
    created = await notification_service(db).enqueue(new())
    workers = await start_workers(
        database_url,
        SimulatedProvider(0, 0, 1),
        webhooks=True,
        webhook_url=url,  # the secrets sign only events for the URL they are configured with
        webhook_secret=f"{OLD_SECRET},{SECRET}",
    )
    try:

        async def delivered() -> bool:
            events = await db.fetch_all(
                "webhook_events_for_notification", {"notification_id": created.notification.id}
            )
            return any(e["state"] == "delivered" for e in events)

        await eventually(delivered, timeout=30, what="the event delivered to the receiver")
    finally:
        await workers.stop()

    event_id = str(uuid.uuid4())
    body = json.dumps({"eventId": event_id, "jobId": str(uuid.uuid4()), "status": "SENT"}).encode()
    now = int(time.time())

    def post(content: bytes, signature: str, stamp: int) -> int:
        headers = {
            "Content-Type": "application/json",
            "webhook-id": event_id,
            "webhook-timestamp": str(stamp),
            "webhook-signature": signature,
        }
        return httpx.post(url, content=content, headers=headers, timeout=10).status_code

    assert post(body, _signed(SECRET, event_id, now, body), now) == 204  # the control
    assert post(body.replace(b"SENT", b"FAILED"), _signed(SECRET, event_id, now, body), now) == 401
    assert post(body, _signed(OLD_SECRET, event_id, now, body), now) == 401
    stale = now - 600
    assert post(body, _signed(SECRET, event_id, stale, body), stale) == 401

    process.kill()
    printed = [json.loads(line) for line in process.communicate()[0].splitlines() if line]
    assert [(e["jobId"], e["status"]) for e in printed] == [
        (str(created.notification.id), "SENT"),
        (printed[1]["jobId"], "SENT"),
    ]
    assert printed[1]["eventId"] == event_id
