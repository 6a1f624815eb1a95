"""Errors a newcomer meets say what to send instead, through a real `notify-queue api` process.

A field named as other APIs name it (`to`, `message`, `delay`) is answered with the field meant;
a token without its `Bearer` scheme, a form-encoded body and `DELETE` of a notification each say
what to send instead; and a notification created with `delaySeconds` says when it is due rather
than naming `sendAt`, which the client never sent.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tests.api.support import PROBLEM, email, key
from tests.support import running_api

TOKEN = "newcomer-token"


@pytest.fixture
async def api(database_url: str, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        running_api(database_url, tmp_path / "api.log", "--api-token", TOKEN) as url,
        httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as http,
    ):
        yield http


async def test_fields_named_as_elsewhere_are_answered_with_the_field_meant(
    api: httpx.AsyncClient,
) -> None:
    body = {"channel": "email", "to": "a@example.com", "message": "hi", "delay": 60, "zz": 1}
    response = await api.post("/notifications", json=body, headers={"Idempotency-Key": key()})

    assert response.status_code == 400
    messages = {e["field"]: e["message"] for e in response.json()["errors"]}
    assert messages["to"] == "is not a field; did you mean `recipient`?"
    assert messages["message"] == "is not a field; did you mean `body`?"
    assert messages["delay"] == "is not a field; did you mean `delaySeconds`?"
    assert messages["zz"] == "Extra inputs are not permitted"  # no guess when none is clear


async def test_a_batch_item_with_such_a_field_is_named_with_its_index(
    api: httpx.AsyncClient,
) -> None:
    item = {"channel": "email", "recipient": "a@example.com", "body": "x", "send_at": "soon"}
    response = await api.post("/notifications/batch", json={"notifications": [item]})

    errors = response.json()["results"][0]["error"]["errors"]
    assert {
        "field": "notifications[0].send_at",
        "message": "is not a field; did you mean `sendAt`?",
    } in errors


async def test_a_token_without_its_scheme_is_told_to_say_bearer(api: httpx.AsyncClient) -> None:
    response = await api.get("/status", headers={"Authorization": TOKEN})

    assert response.status_code == 401 and response.headers["content-type"] == PROBLEM
    detail = response.json()["detail"]
    assert detail == "the Authorization header has no scheme: send `Authorization: Bearer <token>`"
    assert TOKEN not in response.text
    other = await api.get("/status", headers={"Authorization": f"Token {TOKEN}"})
    assert other.json()["detail"].startswith("only Bearer tokens are accepted")


async def test_a_form_encoded_body_is_told_to_send_json(api: httpx.AsyncClient) -> None:
    response = await api.post(
        "/notifications",
        data={"channel": "email", "recipient": "a@example.com", "body": "hi"},
        headers={"Idempotency-Key": key()},
    )

    assert response.status_code == 415 and response.headers["content-type"] == PROBLEM
    assert response.json()["detail"] == (
        "the body must be JSON: send `Content-Type: application/json` "
        "(this request's Content-Type is application/x-www-form-urlencoded)"
    )


async def test_delete_of_a_notification_points_to_cancel(api: httpx.AsyncClient) -> None:
    created = await api.post("/notifications", json=email(), headers={"Idempotency-Key": key()})
    path = f"/notifications/{created.json()['id']}"

    response = await api.delete(path)

    assert response.status_code == 405 and response.headers["content-type"] == PROBLEM
    assert response.headers["allow"] == "GET"
    assert response.json()["detail"] == (
        f"DELETE is not allowed on {path}; to cancel a notification, POST {path}/cancel"
    )


async def test_a_delayed_notification_says_when_it_is_due(api: httpx.AsyncClient) -> None:
    before = datetime.now(UTC)
    created = await api.post(
        "/notifications", json=email(delaySeconds=90), headers={"Idempotency-Key": key()}
    )
    read = await api.get(f"/notifications/{created.json()['id']}")

    for answer in (created.json(), read.json()):
        waiting = answer["waiting"]
        assert waiting["reason"] == "Scheduled"
        match = re.fullmatch(r"due at (\S+Z)", waiting["detail"])
        assert match, waiting["detail"]
        due = datetime.fromisoformat(match[1])
        assert before + timedelta(seconds=89) <= due <= datetime.now(UTC) + timedelta(seconds=91)
        assert "sendAt" not in waiting["detail"]
