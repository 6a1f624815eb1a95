"""Bearer tokens (CONTRACT §4): with --api-token every /notifications* and /status call needs it
(401 with WWW-Authenticate: Bearer otherwise); with --admin-token too, cancel and retry need the
admin token (403 with the client token); /metrics, /healthz, /readyz and /openapi.json stay open;
without tokens everything is open.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.api.support import PROBLEM, api_client, email

API, ADMIN = "client-secret", "admin-secret"
GONE = uuid.UUID(int=0)

CLIENT_ROUTES = [
    ("POST", "/notifications", {"json": email(idempotencyKey="k")}, (201, 200)),
    ("POST", "/notifications/batch", {"json": {"notifications": []}}, (200,)),
    ("GET", "/notifications", {}, (200,)),
    ("GET", f"/notifications/{GONE}", {}, (404,)),
    ("GET", "/status", {}, (200,)),
]
ADMIN_ROUTES = [
    ("POST", f"/notifications/{GONE}/cancel", {}, (404,)),
    ("POST", f"/notifications/{GONE}/retry", {}, (404,)),
    ("POST", "/notifications/retry", {"json": {}}, (200,)),
]
OPEN_ROUTES = [
    ("GET", path, {}, (200,)) for path in ("/metrics", "/healthz", "/readyz", "/openapi.json")
]


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


@pytest.fixture
async def protected(shared_database_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(shared_database_url, api_token=API, admin_token=ADMIN) as http:
        yield http


@pytest.mark.parametrize(("method", "path", "kwargs", "allowed"), CLIENT_ROUTES)
async def test_client_routes_need_the_api_or_admin_token(
    protected: httpx.AsyncClient, method: str, path: str, kwargs: dict, allowed: tuple[int, ...]
) -> None:
    for token in (None, "wrong", API.upper(), API + "x"):
        denied = await protected.request(method, path, headers=bearer(token), **kwargs)
        assert denied.status_code == 401, token
        assert denied.headers["www-authenticate"] == "Bearer"
        assert denied.headers["content-type"] == PROBLEM
        assert API not in denied.text and ADMIN not in denied.text
    for token in (API, ADMIN):
        assert (
            await protected.request(method, path, headers=bearer(token), **kwargs)
        ).status_code in allowed


@pytest.mark.parametrize(("method", "path", "kwargs", "allowed"), ADMIN_ROUTES)
async def test_cancel_and_retry_need_the_admin_token(
    protected: httpx.AsyncClient, method: str, path: str, kwargs: dict, allowed: tuple[int, ...]
) -> None:
    assert (
        await protected.request(method, path, headers=bearer(None), **kwargs)
    ).status_code == 401
    assert (
        await protected.request(method, path, headers=bearer("wrong"), **kwargs)
    ).status_code == 401
    forbidden = await protected.request(method, path, headers=bearer(API), **kwargs)
    assert forbidden.status_code == 403 and forbidden.headers["content-type"] == PROBLEM
    assert (
        await protected.request(method, path, headers=bearer(ADMIN), **kwargs)
    ).status_code in allowed


@pytest.mark.parametrize(("method", "path", "kwargs", "allowed"), OPEN_ROUTES)
async def test_metrics_health_readiness_and_the_document_are_open(
    protected: httpx.AsyncClient, method: str, path: str, kwargs: dict, allowed: tuple[int, ...]
) -> None:
    assert (await protected.request(method, path, **kwargs)).status_code in allowed


async def test_the_scheme_is_not_case_sensitive_but_must_be_bearer(
    protected: httpx.AsyncClient,
) -> None:
    assert (
        await protected.get("/status", headers={"Authorization": f"bearer {API}"})
    ).status_code == 200
    assert (
        await protected.get("/status", headers={"Authorization": f"Basic {API}"})
    ).status_code == 401
    assert (await protected.get("/status", headers={"Authorization": API})).status_code == 401


async def test_with_only_an_api_token_it_also_allows_cancel_and_retry(
    shared_database_url: str,
) -> None:
    async with api_client(shared_database_url, api_token=API) as http:
        for method, path, kwargs, allowed in ADMIN_ROUTES:
            assert (await http.request(method, path, **kwargs)).status_code == 401
            assert (
                await http.request(method, path, headers=bearer(API), **kwargs)
            ).status_code in allowed


async def test_with_only_an_admin_token_only_cancel_and_retry_are_protected(
    shared_database_url: str,
) -> None:
    async with api_client(shared_database_url, admin_token=ADMIN) as http:
        for method, path, kwargs, allowed in CLIENT_ROUTES:
            assert (await http.request(method, path, **kwargs)).status_code in allowed
        for method, path, kwargs, allowed in ADMIN_ROUTES:
            assert (await http.request(method, path, **kwargs)).status_code == 401
            assert (
                await http.request(method, path, headers=bearer(ADMIN), **kwargs)
            ).status_code in allowed


async def test_without_tokens_everything_is_open(shared_client: httpx.AsyncClient) -> None:
    for method, path, kwargs, allowed in CLIENT_ROUTES + ADMIN_ROUTES + OPEN_ROUTES:
        assert (await shared_client.request(method, path, **kwargs)).status_code in allowed, path


async def test_tokens_never_reach_the_log(
    protected: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    await protected.get("/status", headers=bearer(API))
    await protected.get("/status", headers=bearer("guess"))
    await protected.post(f"/notifications/{GONE}/cancel", headers=bearer(API))
    assert API not in caplog.text and "guess" not in caplog.text


@pytest.mark.parametrize(("method", "path", "kwargs", "allowed"), CLIENT_ROUTES + ADMIN_ROUTES)
async def test_the_token_header_works_like_the_bearer_token_for_the_kubernetes_proxy(
    protected: httpx.AsyncClient, method: str, path: str, kwargs: dict, allowed: tuple[int, ...]
) -> None:
    """The API server's service proxy drops Authorization, so `kubectl notify` sends the token
    in X-Notify-Queue-Token: the same checks, the same answers."""
    admin_route = (method, path, kwargs, allowed) in ADMIN_ROUTES
    for token in ("", "wrong", API + "x"):
        denied = await protected.request(
            method, path, headers={"X-Notify-Queue-Token": token}, **kwargs
        )
        assert denied.status_code == 401, token
    with_api = await protected.request(
        method, path, headers={"X-Notify-Queue-Token": API}, **kwargs
    )
    if admin_route:
        assert with_api.status_code == 403
    else:
        assert with_api.status_code in allowed
    with_admin = await protected.request(
        method, path, headers={"X-Notify-Queue-Token": ADMIN}, **kwargs
    )
    assert with_admin.status_code in allowed


async def test_a_bearer_token_is_the_one_checked_when_both_are_sent(
    protected: httpx.AsyncClient,
) -> None:
    both = {"Authorization": "Bearer wrong", "X-Notify-Queue-Token": API}
    assert (await protected.get("/status", headers=both)).status_code == 401
    both = {"Authorization": f"Bearer {API}", "X-Notify-Queue-Token": "wrong"}
    assert (await protected.get("/status", headers=both)).status_code == 200
