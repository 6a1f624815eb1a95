"""GET /notifications/{id} and GET /notifications: reading one (200, 404, 400 for a non-uuid),
and keyset pagination oldest first with filters, no gaps and no repeats while rows are added.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime
from typing import Any

import httpx
import pytest

from tests.api.support import PROBLEM, create, email, fields_named


async def test_a_notification_is_read_by_its_id(shared_client: httpx.AsyncClient) -> None:
    created = await create(shared_client)
    response = await shared_client.get(f"/notifications/{created['id']}")
    assert response.status_code == 200 and response.json() == created


async def test_an_unknown_id_is_a_404_problem(shared_client: httpx.AsyncClient) -> None:
    missing = uuid.uuid4()
    response = await shared_client.get(f"/notifications/{missing}")
    assert response.status_code == 404
    assert response.headers["content-type"] == PROBLEM
    assert str(missing) in response.json()["detail"]


async def test_an_id_that_is_not_a_uuid_is_a_400(shared_client: httpx.AsyncClient) -> None:
    assert fields_named(await shared_client.get("/notifications/42")) == {"id"}


async def page_through(
    client: httpx.AsyncClient, query: str = "", limit: int = 3
) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        url = f"/notifications?limit={limit}{query}" + (f"&cursor={cursor}" if cursor else "")
        page = (await client.get(url)).json()
        seen += page["items"]
        cursor = page["nextCursor"]
        if cursor is None:
            return seen


async def test_pages_run_oldest_first_and_the_last_has_no_cursor(client: httpx.AsyncClient) -> None:
    ids = [(await create(client))["id"] for _ in range(7)]
    first = (await client.get("/notifications?limit=3")).json()
    assert [n["id"] for n in first["items"]] == ids[:3] and first["nextCursor"]
    assert [n["id"] for n in await page_through(client)] == ids
    everything = (await client.get("/notifications")).json()
    assert len(everything["items"]) == 7 and everything["nextCursor"] is None


async def test_filters_select_by_status_channel_and_recipient(client: httpx.AsyncClient) -> None:
    a = await create(client, recipient="a@example.com")
    b = await create(client, recipient="b@example.com")
    sms = await create(client, email(channel="sms", recipient="+4915112345678"))
    await client.post(f"/notifications/{b['id']}/cancel")

    async def ids(query: str) -> list[str]:
        return [n["id"] for n in (await client.get(f"/notifications?{query}")).json()["items"]]

    assert await ids("status=CANCELLED") == [b["id"]]
    assert await ids("status=PENDING") == [a["id"], sms["id"]]
    assert await ids("channel=sms") == [sms["id"]]
    assert await ids("recipient=a@example.com") == [a["id"]]
    assert await ids("channel=email&status=PENDING") == [a["id"]]
    assert await ids("recipient=nobody@example.com") == []


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=ten", "limit"),
        ("status=DONE", "status"),
        ("channel=fax", "channel"),
        ("cursor=not-a-cursor", "cursor"),
        ("cursor=", "cursor"),
        ("recipient=", "recipient"),
        ("recipient=a%00b", "recipient"),
    ],
)
async def test_bad_query_parameters_are_400_problems(
    shared_client: httpx.AsyncClient, query: str, field: str
) -> None:
    assert fields_named(await shared_client.get(f"/notifications?{query}")) == {field}


async def test_a_limit_of_1000_is_accepted(shared_client: httpx.AsyncClient) -> None:
    assert (await shared_client.get("/notifications?limit=1000")).status_code == 200


async def test_paging_while_rows_are_added_has_no_gaps_and_no_repeats(
    client: httpx.AsyncClient,
) -> None:
    batch = {"notifications": [email(idempotencyKey=f"before-{i}") for i in range(150)]}
    assert (await client.post("/notifications/batch", json=batch)).status_code == 200
    before = [n["id"] for n in (await client.get("/notifications?limit=1000")).json()["items"]]
    paging_done = asyncio.Event()

    async def keep_adding() -> int:
        added = 0
        while not paging_done.is_set():
            await create(client)
            added += 1
        return added

    adder = asyncio.create_task(keep_adding())
    seen = await page_through(client, limit=7)
    paging_done.set()
    added = await adder

    ids = [n["id"] for n in seen]
    assert added > 0
    assert len(ids) == len(set(ids)), "a notification was listed twice"
    assert ids[: len(before)] == before, "a notification present from the start was skipped"
    order = [(datetime.fromisoformat(n["createdAt"]), uuid.UUID(n["id"])) for n in seen]
    assert order == sorted(order)
