"""The API over real sockets: 25 identical requests at the same moment create one notification
(one 201, twenty-four 200), through one uvicorn server in this process and through the
`notify-queue api --api-workers 2` command, whose two worker processes share nothing but the
database.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from notify_queue.api.app import create_app
from notify_queue.repositories.db import Database
from tests.api.support import api_settings, email, sql
from tests.support import eventually, running_api


@pytest.fixture
async def served(database_url: str, db: Database) -> AsyncIterator[str]:
    """create_app served by uvicorn on a free loopback port in this event loop; its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(api_settings(database_url), db=db), lifespan="on", log_config=None
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await eventually(lambda: asyncio.sleep(0, server.started))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


async def post_at_once(
    base_url: str, count: int, body: dict[str, Any], key: str
) -> list[httpx.Response]:
    """`count` requests on `count` separate connections, all opened first, then sent together."""
    clients = [httpx.AsyncClient(base_url=base_url, timeout=30) for _ in range(count)]
    try:
        await asyncio.gather(*(c.get("/healthz") for c in clients))  # connections open and warm
        go = asyncio.Event()

        async def send(client: httpx.AsyncClient) -> httpx.Response:
            await go.wait()
            return await client.post("/notifications", json=body, headers={"Idempotency-Key": key})

        tasks = [asyncio.create_task(send(c)) for c in clients]
        await asyncio.sleep(0)
        go.set()
        return await asyncio.gather(*tasks)
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))


async def test_25_identical_requests_at_once_create_one_notification(
    served: str, database_url: str
) -> None:
    responses = await post_at_once(served, 25, email(body="once"), "same-moment")

    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] * 24 + [201]
    assert len({r.json()["id"] for r in responses}) == 1
    assert await sql(database_url, "SELECT count(*) FROM nq_all_notifications") == [(1,)]


@pytest.fixture
async def two_workers(database_url: str, tmp_path: Path) -> AsyncIterator[str]:
    """`notify-queue api --api-workers 2` as a subprocess; its base URL once it is ready."""
    async with running_api(database_url, tmp_path / "api.log", "--api-workers", "2") as url:
        yield url


async def test_two_worker_processes_serve_one_queue_without_duplicates(
    two_workers: str, database_url: str
) -> None:
    async def api_processes() -> int:
        rows = await sql(
            database_url,
            "SELECT count(DISTINCT application_name) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name LIKE 'notify-queue-api-%%'",
        )
        return int(rows[0][0]) if rows[0][0] == 2 else 0

    responses = await post_at_once(two_workers, 25, email(body="across processes"), "two-workers")
    assert sorted(r.status_code for r in responses) == [200] * 24 + [201]

    async with httpx.AsyncClient(base_url=two_workers) as http:
        for i in range(20):  # new connections spread over both processes
            created = await http.post(
                "/notifications", json=email(), headers={"Idempotency-Key": f"w-{i}"}
            )
            assert created.status_code == 201
    assert await sql(database_url, "SELECT count(*) FROM nq_all_notifications") == [(21,)]
    assert await eventually(api_processes) == 2


async def test_an_unexpected_error_answers_500_and_the_client_goes_on(
    served: str, database_url: str
) -> None:
    """An error the API has no answer for (a view gone from under it) is a 500 problem document
    that says the connection closes, and the client's next request is answered. uvicorn closes
    the connection after the traceback either way; without `Connection: close` a client may send
    its next request on it as it closes and read nothing back (httpx.ReadError, seen in
    tests/citus/test_growth.py while the worker nodes lacked a function). The race is not
    reproduced here; removing the header fails the header's assertion."""
    missing = "00000000-0000-7000-8000-000000000000"
    async with httpx.AsyncClient(base_url=served, timeout=30) as http:
        assert (await http.get(f"/notifications/{missing}")).status_code == 404
        await sql(
            database_url, "ALTER VIEW nq_all_notifications RENAME TO nq_all_notifications_gone"
        )
        try:
            broken = await http.get(f"/notifications/{missing}")
            again = await http.get(f"/notifications/{missing}")
        finally:
            await sql(
                database_url, "ALTER VIEW nq_all_notifications_gone RENAME TO nq_all_notifications"
            )
        after = await http.get(f"/notifications/{missing}")
    assert broken.status_code == again.status_code == 500
    assert broken.headers["content-type"] == "application/problem+json"
    assert broken.headers["connection"] == "close"
    assert broken.json()["type"].endswith(":internal-error")
    assert after.status_code == 404
