"""The HTTP edge: unknown routes and methods as problem+json 404/405, oversized bodies refused
with 413 before they are read (declared or streamed), and a database outage answered with 503
problems quickly (never a hang, never a traceback) while /healthz stays up.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.api.support import PROBLEM, api_client, email, key


async def test_an_unknown_route_is_a_404_problem(shared_client: httpx.AsyncClient) -> None:
    response = await shared_client.get("/nothing/here")
    assert response.status_code == 404 and response.headers["content-type"] == PROBLEM
    assert response.json()["status"] == 404


async def test_a_wrong_method_is_a_405_problem_with_allow(shared_client: httpx.AsyncClient) -> None:
    response = await shared_client.delete("/notifications")
    assert response.status_code == 405 and response.headers["content-type"] == PROBLEM
    assert set(response.headers["allow"].replace(" ", "").split(",")) == {"GET", "POST"}


async def test_a_declared_oversized_body_is_a_413_before_the_app_reads_it(
    shared_database_url: str,
) -> None:
    async with api_client(shared_database_url, max_body_bytes=4096) as http:
        ok = await http.post(
            "/notifications", json=email(body="x" * 3000), headers={"Idempotency-Key": key()}
        )
        response = await http.post(
            "/notifications", json=email(body="x" * 5000), headers={"Idempotency-Key": key()}
        )
    assert ok.status_code == 201
    assert response.status_code == 413 and response.headers["content-type"] == PROBLEM
    assert "4096" in response.json()["detail"]


async def test_a_streamed_oversized_body_is_cut_off_after_the_limit(
    shared_database_url: str,
) -> None:
    chunk = b" " * 65_536
    sent = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal sent
        yield b'{"channel": "email", "recipient": "a@example.com", "body": "'
        for _ in range(1_000_000):  # 64 GB if it were all read
            sent += len(chunk)
            yield chunk

    async with api_client(shared_database_url, max_body_bytes=1024 * 1024) as http:
        response = await http.post(
            "/notifications",
            content=endless(),
            headers={"Content-Type": "application/json", "Idempotency-Key": key()},
        )
    assert response.status_code == 413 and response.headers["content-type"] == PROBLEM
    assert sent <= 1024 * 1024 + 2 * len(chunk)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def database_down() -> AsyncIterator[httpx.AsyncClient]:
    """The app pointed at a port where nothing listens, with a short connection wait."""
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere?connect_timeout=1"
    async with api_client(url, database_timeout=0.5) as http:
        yield http


@pytest.mark.parametrize(
    ("method", "path", "kwargs"),
    [
        ("POST", "/notifications", {"json": email(idempotencyKey="k")}),
        ("POST", "/notifications/batch", {"json": {"notifications": [email(idempotencyKey="k")]}}),
        ("GET", "/notifications", {}),
        ("GET", "/notifications/00000000-0000-0000-0000-000000000000", {}),
        ("POST", "/notifications/00000000-0000-0000-0000-000000000000/cancel", {}),
        ("POST", "/notifications/retry", {"json": {}}),
        ("GET", "/status", {}),
        ("GET", "/metrics", {}),
        ("GET", "/readyz", {}),
    ],
)
async def test_a_database_outage_is_a_quick_503_problem(
    database_down: httpx.AsyncClient, method: str, path: str, kwargs: dict
) -> None:
    started = time.monotonic()
    response = await database_down.request(method, path, **kwargs)
    # Not a speed claim: the configured 0.5 s database timeout must end the wait, not the 5 s
    # default (a timer either way; ten times the configured wait is room for a busy machine).
    waited = time.monotonic() - started
    assert waited < 5, f"answered after {waited:.1f}s: the 0.5 s database timeout was not applied"
    assert response.status_code == 503 and response.headers["content-type"] == PROBLEM
    assert response.json()["type"].endswith("database-unavailable")
    assert "Traceback" not in response.text


async def test_validation_still_answers_400_while_the_database_is_down(
    database_down: httpx.AsyncClient,
) -> None:
    response = await database_down.post(
        "/notifications", json={"channel": "fax"}, headers={"Idempotency-Key": "k"}
    )
    assert response.status_code == 400


async def test_healthz_stays_up_while_the_database_is_down(
    database_down: httpx.AsyncClient,
) -> None:
    assert (await database_down.get("/healthz")).status_code == 200


async def test_a_503_names_no_database_server_and_the_log_does(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # libpq's messages name the server ("connection to server at ..., port N failed"): whoever
    # can reach /readyz learns nothing of the database's failure; the operator reads it all in
    # the log (the pool's reason, and the call that met it).
    port = free_port()
    url = f"postgresql://postgres@127.0.0.1:{port}/nowhere?connect_timeout=1"
    caplog.set_level(logging.WARNING)
    async with api_client(url, database_timeout=0.5) as http:
        answers = [await http.get("/readyz"), await http.get("/status")]
    for response in answers:
        assert response.status_code == 503
        assert response.json()["detail"] == (
            "the database is unavailable; retry shortly (the server log says why)"
        )
        assert str(port) not in response.text and "127.0.0.1" not in response.text
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "GET /readyz: database unavailable" in logged
    assert f'connection to server at "127.0.0.1", port {port} failed' in logged
