"""POST /notifications: idempotent creation (201, 200, 409), the idempotency key from the header
or the body, the notification's JSON exactly as the contract shows it, and the body's media type
and syntax (415, 400).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import httpx
import psycopg

from notify_queue.repositories.db import Database
from tests.api.support import PROBLEM, api_client, email, fields_named, key, sql

# In the order of the contract's example.
CONTRACT_FIELDS = (
    "id idempotencyKey channel recipient subject body priority status sendAt nextAttemptAt "
    # CONTRACT §10: why it waits (issue 22).
    "waiting "
    "expiresAt attemptCount maxAttempts lastError sentAt providerMessageId "
    # CONTRACT §9: which provider sent it and the attempts log (issue 11).
    "provider deliveryAttempts "
    # What the provider reported after accepting it (docs/receipts.md).
    "delivery "
    "retries source metadata createdAt updatedAt"
    # CONTRACT §9: what a user-targeted or templated notification was for (issue 12).
    " category recipientId template"
    # CONTRACT §10: the digest it joined (docs/digests.md).
    " digest"
).split()
UTC_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$")


async def test_a_new_key_creates_the_notification_with_201_and_its_location(
    shared_client: httpx.AsyncClient,
) -> None:
    response = await shared_client.post(
        "/notifications", json=email(), headers={"Idempotency-Key": "order-1"}
    )

    assert response.status_code == 201
    created = response.json()
    assert response.headers["location"] == f"/notifications/{created['id']}"
    assert (await shared_client.get(response.headers["location"])).json() == created


async def test_the_notification_json_has_exactly_the_contract_fields_in_camel_case(
    shared_client: httpx.AsyncClient,
) -> None:
    send_at = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    body = email(
        subject="Your receipt",
        priority="HIGH",
        sendAt="2030-01-02T04:04:05+01:00",
        expiresAt="2030-01-03T00:00:00Z",
        metadata={"order": 1001, "tags": ["a"]},
    )
    response = await shared_client.post(
        "/notifications", json=body, headers={"Idempotency-Key": "order-1001-receipt"}
    )

    n = response.json()
    assert list(n) == CONTRACT_FIELDS
    assert n["idempotencyKey"] == "order-1001-receipt"
    assert (n["channel"], n["recipient"], n["subject"], n["body"]) == (
        "email",
        "a@example.com",
        "Your receipt",
        "hello",
    )
    assert (n["priority"], n["status"], n["source"]) == ("HIGH", "PENDING", "api")
    assert n["sendAt"] == n["nextAttemptAt"] == "2030-01-02T03:04:05Z"
    assert datetime.fromisoformat(n["sendAt"]) == send_at
    assert n["expiresAt"] == "2030-01-03T00:00:00Z"
    assert (n["attemptCount"], n["maxAttempts"], n["retries"]) == (0, 6, [])
    assert n["lastError"] is n["sentAt"] is n["providerMessageId"] is n["provider"] is None
    assert n["deliveryAttempts"] == []
    assert n["metadata"] == {"order": 1001, "tags": ["a"]}
    for field in ("sendAt", "nextAttemptAt", "createdAt", "updatedAt"):
        assert UTC_TIME.match(n[field]), n[field]


async def test_max_attempts_comes_from_the_settings_default(
    database_url: str, db: Database
) -> None:
    async with api_client(database_url, db=db, max_attempts=3) as http:
        response = await http.post(
            "/notifications", json=email(), headers={"Idempotency-Key": key()}
        )
    assert response.json()["maxAttempts"] == 3


async def test_the_same_request_with_the_same_key_answers_200_with_the_original(
    client: httpx.AsyncClient, database_url: str
) -> None:
    first = await client.post("/notifications", json=email(), headers={"Idempotency-Key": "k1"})
    again = await client.post("/notifications", json=email(), headers={"Idempotency-Key": "k1"})

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    assert "location" not in again.headers
    assert await sql(database_url, "SELECT count(*) FROM nq_all_notifications") == [(1,)]


async def test_a_repeated_delay_seconds_request_is_the_same_request(
    shared_client: httpx.AsyncClient,
) -> None:
    first = await shared_client.post(
        "/notifications", json=email(delaySeconds=60), headers={"Idempotency-Key": "d"}
    )
    again = await shared_client.post(
        "/notifications", json=email(delaySeconds=60), headers={"Idempotency-Key": "d"}
    )

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["sendAt"] == first.json()["sendAt"]


async def test_the_key_may_come_in_the_body_and_matches_the_same_key_in_the_header(
    client: httpx.AsyncClient,
) -> None:
    in_body = await client.post("/notifications", json=email(idempotencyKey="kb"))
    in_header = await client.post("/notifications", json=email(), headers={"Idempotency-Key": "kb"})
    in_both = await client.post(
        "/notifications", json=email(idempotencyKey="kb"), headers={"Idempotency-Key": "kb"}
    )

    assert [r.status_code for r in (in_body, in_header, in_both)] == [201, 200, 200]
    assert in_body.json()["idempotencyKey"] == "kb"


async def test_the_same_key_with_another_request_is_a_409_naming_the_existing_notification(
    shared_client: httpx.AsyncClient,
) -> None:
    first = await shared_client.post(
        "/notifications", json=email(), headers={"Idempotency-Key": "k2"}
    )
    other = await shared_client.post(
        "/notifications", json=email(body="different"), headers={"Idempotency-Key": "k2"}
    )

    assert other.status_code == 409
    assert other.headers["content-type"] == PROBLEM
    problem = other.json()
    existing = first.json()["id"]
    assert existing in problem["detail"]
    assert problem["existingId"] == existing
    assert (problem["status"], problem["title"]) == (409, "Conflict")


async def test_a_header_key_and_a_different_body_key_is_a_400(
    shared_client: httpx.AsyncClient,
) -> None:
    response = await shared_client.post(
        "/notifications", json=email(idempotencyKey="a"), headers={"Idempotency-Key": "b"}
    )
    assert fields_named(response) == {"idempotencyKey"}


async def test_a_request_without_any_idempotency_key_is_a_400(
    shared_client: httpx.AsyncClient,
) -> None:
    response = await shared_client.post("/notifications", json=email())
    assert fields_named(response) == {"Idempotency-Key"}


async def test_a_body_of_another_media_type_is_a_415_problem(
    shared_client: httpx.AsyncClient,
) -> None:
    for content_type in (
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/json; charset=latin-1",
    ):
        response = await shared_client.post(
            "/notifications",
            content=b'{"channel": "email"}',
            headers={"Content-Type": content_type, "Idempotency-Key": key()},
        )
        assert response.status_code == 415, content_type
        assert response.headers["content-type"] == PROBLEM
    missing = await shared_client.post(
        "/notifications", content=b"{}", headers={"Idempotency-Key": key()}
    )
    assert missing.status_code == 415


async def test_a_json_suffix_media_type_with_utf8_charset_is_accepted(
    shared_client: httpx.AsyncClient,
) -> None:
    response = await shared_client.post(
        "/notifications",
        content=b'{"channel": "push", "recipient": "device-token", "body": "hi"}',
        headers={"Content-Type": "application/merge+json; charset=UTF-8", "Idempotency-Key": key()},
    )
    assert response.status_code == 201


async def test_malformed_json_is_a_400_problem(shared_client: httpx.AsyncClient) -> None:
    for raw in (
        b'{"channel": "email",',
        b"",
        b"\xff\xfe",
        b'{"body": NaN}',
        b"[" * 100_000,
        b'{"n": 1e999}',
        b"\xef\xbb\xbf{}",  # a byte-order mark
    ):
        response = await shared_client.post(
            "/notifications",
            content=raw,
            headers={"Content-Type": "application/json", "Idempotency-Key": key()},
        )
        assert fields_named(response) == {"$"}, raw[:20]


async def test_a_json_value_that_is_not_an_object_is_a_400(
    shared_client: httpx.AsyncClient,
) -> None:
    for raw in (b"[]", b'"text"', b"3", b"null"):
        response = await shared_client.post(
            "/notifications",
            content=raw,
            headers={"Content-Type": "application/json", "Idempotency-Key": key()},
        )
        assert fields_named(response) == {"$"}


async def test_a_send_time_in_the_past_is_due_at_once(client: httpx.AsyncClient) -> None:
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    response = await client.post(
        "/notifications", json=email(sendAt=past), headers={"Idempotency-Key": key()}
    )
    assert response.status_code == 201
    status = (await client.get("/status")).json()
    assert status["due"]["NORMAL"] == 1


async def test_creating_a_notification_wakes_the_workers(
    client: httpx.AsyncClient, database_url: str
) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as listener:
        await listener.execute("LISTEN nq_wakeup")
        response = await client.post(
            "/notifications", json=email(), headers={"Idempotency-Key": key()}
        )
        assert response.status_code == 201
        woken = [n.channel async for n in listener.notifies(timeout=30, stop_after=1)]
    assert woken == ["nq_wakeup"]
