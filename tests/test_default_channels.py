"""A worker started without --channels serves every channel, voice included; one started with
--channels leaves the others alone. Real `notify-queue api` and `notify-queue worker` processes
(simulated provider), the notifications sent through the API."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import eventually, running_api

CALL = {"channel": "voice", "recipient": "+4930123456", "body": "db-1 is down"}
MAIL = {"channel": "email", "recipient": "ops@example.com", "subject": "db-1", "body": "down"}


@pytest.fixture
def worker(database_url: str, tmp_path: Path) -> Iterator[Any]:
    """`worker(*flags)` starts `notify-queue worker` on the test's database; killed at the end."""
    started: list[subprocess.Popen[bytes]] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFY_QUEUE_")}

    def start(*flags: str) -> subprocess.Popen[bytes]:
        log = (tmp_path / f"worker-{len(started)}.log").open("wb")
        command = [sys.executable, "-m", "notify_queue", "worker", "--database-url", database_url]
        proc = subprocess.Popen(
            [*command, "--poll-interval", "0.2", *flags],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait(timeout=10)


@asynccontextmanager
async def api(database_url: str, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        running_api(database_url, tmp_path / "api.log") as url,
        httpx.AsyncClient(base_url=url) as http,
    ):
        yield http


async def send(http: httpx.AsyncClient, body: dict[str, str]) -> str:
    made = await http.post("/notifications", json={**body, "idempotencyKey": body["channel"]})
    assert made.status_code == 201, made.text
    return str(made.json()["id"])


async def sent(http: httpx.AsyncClient, id: str) -> bool:
    return (await http.get(f"/notifications/{id}")).json()["status"] == "SENT"


async def test_a_worker_without_channels_calls_the_voice_number(
    database_url: str, tmp_path: Path, worker: Any
) -> None:
    async with api(database_url, tmp_path) as http:
        call = await send(http, CALL)
        worker()
        await eventually(lambda: sent(http, call), timeout=60, what="the call sent")


async def test_a_worker_with_channels_email_leaves_the_call_pending(
    database_url: str, tmp_path: Path, worker: Any
) -> None:
    async with api(database_url, tmp_path) as http:
        # The call is due first: a worker that served voice would claim it no later than the mail.
        call = await send(http, CALL)
        mail = await send(http, MAIL)
        worker("--channels", "email")
        await eventually(lambda: sent(http, mail), timeout=60, what="the mail sent")
        assert (await http.get(f"/notifications/{call}")).json()["status"] == "PENDING"
