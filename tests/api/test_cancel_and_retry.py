"""Cancel and retry (CONTRACT §3): cancel only from PENDING, retry only from FAILED or
DEAD_LETTERED (back to PENDING, attemptCount 0, the retry recorded), 409 from any other state,
404 for an unknown id; and the batch retry's `remaining` countdown.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from notify_queue.models import DeliveryResult, Outcome
from notify_queue.repositories.db import Database
from tests.api.support import PROBLEM, api_client, create, email, fields_named, sql
from tests.support import delivery_service, set_status_sql


async def deliver(db: Database, outcome: Outcome) -> None:
    """Claim every due notification and complete it with `outcome` (as a worker would)."""
    service = delivery_service(db)
    batch = await service.claim(100)
    await service.complete(
        [(c, DeliveryResult(outcome, error="provider said no")) for c in batch.claimed]
    )


async def test_a_pending_notification_is_cancelled_once(client: httpx.AsyncClient) -> None:
    n = await create(client)
    cancelled = await client.post(f"/notifications/{n['id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "CANCELLED"

    again = await client.post(f"/notifications/{n['id']}/cancel")
    assert again.status_code == 409 and again.headers["content-type"] == PROBLEM
    assert "CANCELLED" in again.json()["detail"]


async def test_a_notification_being_delivered_or_finished_cannot_be_cancelled(
    client: httpx.AsyncClient, db: Database
) -> None:
    n = await create(client)
    batch = await delivery_service(db).claim(10)
    assert (await client.post(f"/notifications/{n['id']}/cancel")).status_code == 409  # PROCESSING
    await delivery_service(db).complete([(batch.claimed[0], DeliveryResult(Outcome.SENT))])
    assert (await client.post(f"/notifications/{n['id']}/cancel")).status_code == 409  # SENT


async def test_a_failed_notification_is_retried_back_to_pending_with_the_retry_recorded(
    client: httpx.AsyncClient, db: Database
) -> None:
    n = await create(client)
    await deliver(db, Outcome.PERMANENT_FAILURE)
    failed = (await client.get(f"/notifications/{n['id']}")).json()
    assert (failed["status"], failed["attemptCount"], failed["lastError"]) == (
        "FAILED",
        1,
        "provider said no",
    )

    retried = await client.post(f"/notifications/{n['id']}/retry")

    assert retried.status_code == 200
    body = retried.json()
    assert (body["status"], body["attemptCount"], body["lastError"]) == ("PENDING", 0, None)
    assert [r["fromStatus"] for r in body["retries"]] == ["FAILED"]
    assert body["retries"][0]["at"].endswith("Z")


async def test_a_dead_lettered_notification_is_retried_and_each_retry_is_appended(
    database_url: str, db: Database
) -> None:
    async with api_client(database_url, db=db, max_attempts=1) as http:
        n = await create(http)
        await deliver(db, Outcome.TEMPORARY_FAILURE)
        assert (await http.get(f"/notifications/{n['id']}")).json()["status"] == "DEAD_LETTERED"
        assert (await http.post(f"/notifications/{n['id']}/retry")).status_code == 200
        await deliver(db, Outcome.PERMANENT_FAILURE)
        second = await http.post(f"/notifications/{n['id']}/retry")
    assert [r["fromStatus"] for r in second.json()["retries"]] == ["DEAD_LETTERED", "FAILED"]


@pytest.mark.parametrize("status", ["PENDING", "PROCESSING", "SENT", "CANCELLED", "EXPIRED"])
async def test_retry_from_any_other_status_is_a_409(
    client: httpx.AsyncClient, database_url: str, status: str
) -> None:
    n = await create(client)
    await sql(database_url, set_status_sql("true"), {"status": status})
    response = await client.post(f"/notifications/{n['id']}/retry")
    assert response.status_code == 409 and status in response.json()["detail"]


@pytest.mark.parametrize("action", ["cancel", "retry"])
async def test_cancel_and_retry_of_an_unknown_id_are_404_and_of_a_non_uuid_400(
    client: httpx.AsyncClient, action: str
) -> None:
    assert (await client.post(f"/notifications/{uuid.uuid4()}/{action}")).status_code == 404
    assert fields_named(await client.post(f"/notifications/nope/{action}")) == {"id"}


async def add_finished(
    client: httpx.AsyncClient, database_url: str, count: int, status: str
) -> None:
    for start in range(0, count, 1000):
        items = [
            email(idempotencyKey=f"{status}-{i}") for i in range(start, min(start + 1000, count))
        ]
        assert (
            await client.post("/notifications/batch", json={"notifications": items})
        ).status_code == 200
    await sql(database_url, set_status_sql("status = 'PENDING'"), {"status": status})


async def retry_all(client: httpx.AsyncClient, **body: Any) -> list[tuple[int, int]]:
    answers = []
    while True:
        response = await client.post("/notifications/retry", json=body)
        assert response.status_code == 200, response.text
        answers.append((response.json()["retried"], response.json()["remaining"]))
        if answers[-1][1] == 0:
            return answers


async def test_batch_retry_counts_down_remaining_1000_at_a_time(
    client: httpx.AsyncClient, database_url: str
) -> None:
    await add_finished(client, database_url, 2500, "DEAD_LETTERED")

    assert await retry_all(client) == [(1000, 1500), (1000, 500), (500, 0)]
    assert await sql(
        database_url, "SELECT status, count(*) FROM nq_all_notifications GROUP BY status"
    ) == [("PENDING", 2500)]


async def test_batch_retry_takes_the_status_and_limit_asked_for(
    client: httpx.AsyncClient, database_url: str
) -> None:
    await add_finished(client, database_url, 5, "FAILED")
    assert await retry_all(client, status="FAILED", limit=2) == [(2, 3), (2, 1), (1, 0)]
    assert await retry_all(client) == [(0, 0)]  # nothing DEAD_LETTERED


async def test_batch_retry_without_a_body_uses_the_defaults(client: httpx.AsyncClient) -> None:
    response = await client.post("/notifications/retry")
    assert response.status_code == 200 and response.json() == {"retried": 0, "remaining": 0}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"status": "PENDING"}, "status"),
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"limit": "10"}, "limit"),
        ({"everything": True}, "everything"),
    ],
)
async def test_batch_retry_rejects_bad_bodies_with_400(
    client: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    assert fields_named(await client.post("/notifications/retry", json=body)) == {field}
