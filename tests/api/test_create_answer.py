"""A create's answer is the notification a read gives, byte for byte.

The enqueue returns only what the server decides (nq_enqueue_pending, 0024: the id, max_attempts,
the times, the waiting fields, metadata as jsonb stores it) and the API builds the rest of its
answer from the request it validated (repositories.rows.enqueued_notifications). These tests hold
that answer to `GET /notifications/{id}` of the same notification, for the fields the request
shapes: metadata whose keys and numbers jsonb normalises, times in another offset, a send time
ahead (waiting), a policy's max_attempts, a template, a category, and the batch's items.
"""

from __future__ import annotations

from typing import Any

import httpx

from notify_queue.models import Policy
from notify_queue.repositories.db import Database
from notify_queue.repositories.policies import PolicyRepository
from tests.api.support import email, key

# jsonb keeps keys by length, then bytes, one per name (the last), and numbers as written but for
# exponents; a read shows that, so the create's answer must too.
METADATA = {"zeta": 1.0, "a": 1e3, "mid": [3, {"y": 2, "x": None}], "é": "ünïcode", "n": 10**18}


async def _same_as_read(http: httpx.AsyncClient, created: httpx.Response) -> dict[str, Any]:
    read = await http.get(f"/notifications/{created.json()['id']}")
    assert read.status_code == 200, read.text
    assert created.content == read.content
    answer: dict[str, Any] = created.json()
    return answer


async def test_a_single_create_answers_what_a_read_of_it_shows(
    shared_client: httpx.AsyncClient,
) -> None:
    created = await shared_client.post(
        "/notifications",
        json=email(subject="Your receipt", priority="HIGH", metadata=METADATA),
        headers={"Idempotency-Key": key()},
    )

    assert created.status_code == 201, created.text
    answer = await _same_as_read(shared_client, created)
    # Due now, and no worker runs in these tests: it waits NoWorker, in the answer as in a read.
    assert answer["waiting"]["reason"] == "NoWorker" and answer["status"] == "PENDING"


async def test_a_scheduled_create_answers_its_waiting_and_times_as_a_read_shows_them(
    shared_client: httpx.AsyncClient,
) -> None:
    created = await shared_client.post(
        "/notifications",
        json=email(
            sendAt="2999-01-02T04:04:05.123456+01:00",
            expiresAt="2999-01-03T00:00:00-05:30",
            category="marketing",
            webhookUrl="https://hooks.example.com/x",
        ),
        headers={"Idempotency-Key": key()},
    )

    assert created.status_code == 201, created.text
    answer = await _same_as_read(shared_client, created)
    assert answer["waiting"]["reason"] == "Scheduled"
    assert answer["sendAt"] == "2999-01-02T03:04:05.123456Z"


async def test_a_create_under_a_policy_answers_the_policys_max_attempts(
    client: httpx.AsyncClient, db: Database
) -> None:
    await PolicyRepository(db).policy_upsert(policy=Policy(name="ns/three", max_attempts=3))

    created = await client.post(
        "/notifications",
        json=email(policy="ns/three"),
        headers={"Idempotency-Key": key()},
    )

    assert created.status_code == 201, created.text
    assert (await _same_as_read(client, created))["maxAttempts"] == 3


async def test_a_templated_create_answers_what_a_read_shows(client: httpx.AsyncClient) -> None:
    template = {"channels": {"email": {"subject": "Order {{ order }}", "body": "Total {{ t }}."}}}
    assert (await client.put("/templates/receipt", json=template)).status_code == 201

    created = await client.post(
        "/notifications",
        json={
            "channel": "email",
            "recipient": "a@example.com",
            "template": "receipt",
            "data": {"order": 7, "t": "9.50"},
        },
        headers={"Idempotency-Key": key()},
    )

    assert created.status_code == 201, created.text
    answer = await _same_as_read(client, created)
    assert answer["template"] == {"name": "receipt", "version": 1}


async def test_a_batchs_items_answer_what_reads_of_them_show(
    shared_client: httpx.AsyncClient,
) -> None:
    items = [
        {**email(metadata=METADATA), "idempotencyKey": key()},
        {**email(sendAt="2999-01-01T00:00:00Z"), "idempotencyKey": key()},
    ]

    response = await shared_client.post("/notifications/batch", json={"notifications": items})

    assert response.status_code == 200, response.text
    for result in response.json()["results"]:
        assert result["status"] == 201
        read = await shared_client.get(f"/notifications/{result['notification']['id']}")
        assert result["notification"] == read.json()
