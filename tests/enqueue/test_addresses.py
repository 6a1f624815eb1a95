"""Both doors store an address in one form: the API normalises it with `idna` and
`phonenumbers`, notify_queue_enqueue lower-cases an ASCII email domain and takes E.164 numbers
only, refusing what it cannot normalise with an error naming the form it wants (the shared
table tests/enqueue/cases.py, ADDRESS_CASES; docs/enqueue.md, "Addresses")."""

from __future__ import annotations

import psycopg
import pytest

from tests.api.support import api_client, key
from tests.enqueue.cases import ADDRESS_CASES, refused
from tests.enqueue.support import call_function, function_errors


def _function_stores(database_url: str, channel: str, written: str) -> str:
    body = {"channel": channel, "recipient": written, "body": "hello"}
    errors = function_errors(database_url, body, key())
    if errors is not None:
        assert [e["field"] for e in errors] == ["recipient"], errors
        return refused(errors[0]["message"])
    with psycopg.connect(database_url) as conn:
        try:
            return str(call_function(conn, body, key())["recipient"])
        finally:
            conn.rollback()


@pytest.mark.parametrize(
    ("channel", "written", "api_stores", "function_stores"),
    [case[1:] for case in ADDRESS_CASES],
    ids=[case[0] for case in ADDRESS_CASES],
)
async def test_each_door_stores_an_address_in_its_one_form_or_says_which_form_it_wants(
    database_url: str, channel: str, written: str, api_stores: str, function_stores: str
) -> None:
    async with api_client(database_url) as http:
        response = await http.post(
            "/notifications",
            json={"channel": channel, "recipient": written, "body": "hello"},
            headers={"Idempotency-Key": key()},
        )
    if response.status_code == 201:
        assert response.json()["recipient"] == api_stores
    else:
        assert response.status_code == 400, response.text
        assert refused(response.json()["errors"][0]["message"]) == api_stores
    assert _function_stores(database_url, channel, written) == function_stores
