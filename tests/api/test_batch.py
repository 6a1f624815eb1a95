"""POST /notifications/batch: one result per item in order (201, 200, 409 or 400), invalid items
answered without stopping the valid ones, and all valid items enqueued by one service call.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from notify_queue.repositories.db import Database
from notify_queue.services.notifications import NotificationService
from tests.api.support import PROBLEM, email, fields_named, running_app, sql


def item(key: str, **fields: Any) -> dict[str, Any]:
    return email(idempotencyKey=key, **fields)


async def test_each_item_gets_its_own_status_in_the_order_sent(client: httpx.AsyncClient) -> None:
    existing = await client.post(
        "/notifications/batch", json={"notifications": [item("old"), item("clash")]}
    )
    assert [r["status"] for r in existing.json()["results"]] == [201, 201]
    clash_id = existing.json()["results"][1]["notification"]["id"]

    response = await client.post(
        "/notifications/batch",
        json={
            "notifications": [
                item("new-1"),
                item("old"),
                item("bad", recipient="nope"),
                item("clash", body="another body"),
                item("new-2", channel="sms", recipient="+4915112345678"),
            ]
        },
    )

    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["status"] for r in results] == [201, 200, 400, 409, 201]
    assert results[0]["notification"]["idempotencyKey"] == "new-1"
    assert results[1]["notification"] == existing.json()["results"][0]["notification"]
    assert results[2]["error"]["errors"] == [
        {
            "field": "notifications[2].recipient",
            "message": "must be an email address for channel email",
        }
    ]
    assert results[2]["error"]["status"] == 400
    assert (
        clash_id in results[3]["error"]["detail"] and results[3]["error"]["existingId"] == clash_id
    )
    assert results[4]["notification"]["channel"] == "sms"
    assert all(("notification" in r) != ("error" in r) for r in results)


async def test_valid_items_go_through_one_enqueue_many_call(
    database_url: str, db: Database
) -> None:
    async with running_app(database_url, db=db) as (app, http):
        service: NotificationService = app.state.runtime.service
        calls: list[int] = []
        original = service.enqueue_many

        async def counting(notifications: Any) -> Any:
            calls.append(len(notifications))
            return await original(notifications)

        service.enqueue_many = counting  # type: ignore[method-assign]
        items = [item(f"k-{i}") for i in range(1000)]
        items[500] = item("k-500", body="")
        response = await http.post("/notifications/batch", json={"notifications": items})

    assert calls == [999]
    statuses = [r["status"] for r in response.json()["results"]]
    assert statuses.count(201) == 999 and statuses[500] == 400
    assert await sql(database_url, "SELECT count(*) FROM nq_all_notifications") == [(999,)]


async def test_a_key_repeated_within_one_batch_creates_one_notification(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(
        "/notifications/batch",
        json={"notifications": [item("twice"), item("twice"), item("twice", body="other")]},
    )
    results = response.json()["results"]
    assert [r["status"] for r in results] == [201, 200, 409]
    assert results[0]["notification"]["id"] == results[1]["notification"]["id"]


async def test_every_item_needs_its_own_idempotency_key(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/notifications/batch",
        json={"notifications": [email(), item("fine")]},
        headers={"Idempotency-Key": "x"},
    )
    results = response.json()["results"]
    assert [r["status"] for r in results] == [400, 201]
    assert [e["field"] for e in results[0]["error"]["errors"]] == [
        "notifications[0].idempotencyKey"
    ]


async def test_items_that_are_not_objects_are_400_results(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/notifications/batch", json={"notifications": ["text", None, item("ok")]}
    )
    results = response.json()["results"]
    assert [r["status"] for r in results] == [400, 400, 201]
    assert results[0]["error"]["errors"][0]["field"] == "notifications[0]"


async def test_an_empty_batch_has_no_results(client: httpx.AsyncClient) -> None:
    response = await client.post("/notifications/batch", json={"notifications": []})
    assert response.status_code == 200 and response.json() == {"results": []}


async def test_more_than_1000_items_is_a_400_for_the_whole_batch(
    client: httpx.AsyncClient, database_url: str
) -> None:
    response = await client.post(
        "/notifications/batch", json={"notifications": [item(f"k{i}") for i in range(1001)]}
    )
    assert fields_named(response) == {"notifications"}
    assert await sql(database_url, "SELECT count(*) FROM nq_all_notifications") == [(0,)]


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({}, {"notifications"}),
        ({"notifications": {}}, {"notifications"}),
        ({"notifications": [], "extra": 1}, {"extra"}),
        ([], {"$"}),
    ],
)
async def test_a_batch_that_is_not_an_object_with_a_notifications_array_is_a_400(
    client: httpx.AsyncClient, body: Any, fields: set[str]
) -> None:
    response = await client.post("/notifications/batch", json=body)
    assert fields_named(response) == fields
    assert response.headers["content-type"] == PROBLEM


async def test_a_batch_needs_a_json_body(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/notifications/batch", content=b"notifications=1", headers={"Content-Type": "text/plain"}
    )
    assert response.status_code == 415
