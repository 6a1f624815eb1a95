"""Addresses are stored in one form, through the real `notify-queue api` process: email domains
IDNA-encoded and lower-cased (the local part kept), phone numbers in E.164 with
`--default-region` for national ones, so two spellings of one address are one rate window for a
real worker; an address that cannot be normalised is a 400 naming the field, and nothing is
stored (docs/recipients.md, "Addresses")."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.support import PROBLEM, fields_named, key, sql
from tests.chaos.harness import WorkerProcesses
from tests.support import eventually, running_api


@pytest.fixture
async def api_gb(database_url: str, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """`notify-queue api --default-region GB` and a client of it."""
    async with (
        running_api(database_url, tmp_path / "api.log", "--default-region", "GB") as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=30) as http,
    ):
        yield http


async def _post(http: httpx.AsyncClient, channel: str, recipient: str) -> httpx.Response:
    body = {"channel": channel, "recipient": recipient, "body": "hello"}
    return await http.post("/notifications", json=body, headers={"Idempotency-Key": key()})


async def _stored_recipient(database_url: str, id: str) -> str:
    rows = await sql(database_url, "SELECT recipient FROM nq_all_notifications WHERE id = %s", [id])
    return str(rows[0][0])


async def test_a_national_number_with_a_default_region_is_stored_and_answered_in_e164(
    api_gb: httpx.AsyncClient, database_url: str
) -> None:
    for written in ("+44 20 7946 0958", "020 7946 0958"):
        response = await _post(api_gb, "sms", written)
        assert response.status_code == 201, response.text
        created = response.json()
        assert created["recipient"] == "+442079460958"
        assert (await api_gb.get(f"/notifications/{created['id']}")).json()["recipient"] == (
            "+442079460958"
        )
        assert await _stored_recipient(database_url, created["id"]) == "+442079460958"


async def test_a_national_number_without_a_default_region_is_a_400_naming_the_recipient(
    api: httpx.AsyncClient,
) -> None:
    response = await _post(api, "sms", "020 7946 0958")
    assert fields_named(response) == {"recipient"}
    assert "E.164" in response.json()["errors"][0]["message"]


async def test_an_international_domain_is_stored_idna_encoded_with_the_local_part_kept(
    api: httpx.AsyncClient, database_url: str
) -> None:
    response = await _post(api, "email", "a@BÜCHER.example")
    assert response.status_code == 201, response.text
    assert response.json()["recipient"] == "a@xn--bcher-kva.example"
    assert await _stored_recipient(database_url, response.json()["id"]) == (
        "a@xn--bcher-kva.example"
    )
    kept = await _post(api, "email", "Ann.Lee@Example.COM")
    assert kept.json()["recipient"] == "Ann.Lee@example.com"


@pytest.mark.parametrize(
    ("channel", "recipient"),
    [
        ("email", "a@exa_mple.com"),  # "_" is no letter, digit or hyphen of a domain name
        ("email", "a@-example.com"),
        ("email", "a@example..com"),
        ("sms", "+44 20 7946 0958 ext. 12"),
        ("sms", "+999 123456789"),  # no country has code 999
        ("voice", "tel:+442079460958"),
    ],
)
async def test_an_address_that_cannot_be_normalised_is_a_400_and_nothing_is_stored(
    api: httpx.AsyncClient, database_url: str, channel: str, recipient: str
) -> None:
    before = await sql(database_url, "SELECT count(*) FROM nq_all_notifications")
    response = await _post(api, channel, recipient)
    assert response.headers["content-type"] == PROBLEM
    assert fields_named(response) == {"recipient"}
    assert await sql(database_url, "SELECT count(*) FROM nq_all_notifications") == before


async def test_a_recipient_is_stored_with_its_addresses_normalised(
    api_gb: httpx.AsyncClient,
) -> None:
    id = f"u-{uuid.uuid4().hex[:8]}"
    body = {"email": "a@BÜCHER.example", "phone": "020 7946 0958", "voice": "+44 20 7946 0000"}
    put = await api_gb.put(f"/recipients/{id}", json=body)
    assert put.status_code in (200, 201), put.text
    got = (await api_gb.get(f"/recipients/{id}")).json()
    assert (got["email"], got["phone"], got["voice"]) == (
        "a@xn--bcher-kva.example",
        "+442079460958",
        "+442079460000",
    )
    bad = await api_gb.put(f"/recipients/{id}-2", json={"email": "a@exa_mple.com"})
    assert fields_named(bad) == {"email"}
    assert (await api_gb.get(f"/recipients/{id}-2")).status_code == 404


async def test_two_spellings_of_one_address_share_one_rate_window(
    api: httpx.AsyncClient, workers: WorkerProcesses
) -> None:
    # One notification per address per hour: the second spelling must wait for the first's slot.
    workers.start("--provider", "simulated", "--rate-limit", "1", "--poll-interval", "0.2")
    await workers.ready()
    first = (await _post(api, "email", "dora@Example.COM")).json()
    second = (await _post(api, "email", "dora@example.com")).json()
    assert first["recipient"] == second["recipient"] == "dora@example.com"

    async def states() -> list[dict[str, Any]]:
        return [(await api.get(f"/notifications/{n['id']}")).json() for n in (first, second)]

    async def one_sent_one_waiting() -> bool:
        a, b = await states()
        return {a["status"], b["status"]} == {"SENT", "PENDING"} and any(
            (n["waiting"] or {}).get("reason") == "RecipientRateLimit" for n in (a, b)
        )

    await eventually(one_sent_one_waiting, timeout=60)
