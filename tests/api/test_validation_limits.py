"""The limits of every field of a create request, at the HTTP edge: the last valid value is
accepted and the first invalid one is a 400 problem naming that field; several bad fields are
named together; input PostgreSQL could not store is refused before it reaches the database.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.support import email, fields_named, key


async def post(http: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
    return await http.post("/notifications", json=body, headers={"Idempotency-Key": key()})


@pytest.mark.parametrize(
    ("channel", "recipient"),
    [
        ("email", "a@example.com"),
        ("email", "first.last+tag@mail.example.co.uk"),
        ("email", "x" * 308 + "@example.com"),  # 320 characters
        ("sms", "+12345678"),  # 8 digits
        ("sms", "+123456789012345"),  # 15 digits
        ("push", "fcm:abc-DEF_123"),
        ("push", "t" * 320),
    ],
)
async def test_recipients_in_each_channels_format_are_accepted(
    shared_client: httpx.AsyncClient, channel: str, recipient: str
) -> None:
    response = await post(shared_client, {"channel": channel, "recipient": recipient, "body": "hi"})
    assert response.status_code == 201, response.text


@pytest.mark.parametrize(
    ("channel", "recipient"),
    [
        ("email", "not-an-address"),
        ("email", "a@b"),
        ("email", "a b@example.com"),
        ("email", "a@example.com\n"),
        ("email", "x" * 309 + "@example.com"),  # 321 characters
        ("sms", "12345678"),  # no +
        ("sms", "+1234567"),  # 7 digits
        ("sms", "+1234567890123456"),  # 16 digits
        ("sms", "+1234-567x"),  # a letter (separators alone are read: docs/recipients.md)
        ("push", ""),
        ("push", "   "),
        ("push", "t" * 321),
    ],
)
async def test_recipients_outside_their_channels_format_are_named(
    shared_client: httpx.AsyncClient, channel: str, recipient: str
) -> None:
    response = await post(shared_client, {"channel": channel, "recipient": recipient, "body": "hi"})
    assert fields_named(response) == {"recipient"}


async def test_an_unknown_channel_is_named(shared_client: httpx.AsyncClient) -> None:
    assert fields_named(await post(shared_client, email(channel="fax"))) == {"channel"}


async def test_a_body_of_65536_utf8_bytes_is_accepted_and_65537_is_named(
    shared_client: httpx.AsyncClient,
) -> None:
    assert (await post(shared_client, email(body="x" * 65_536))).status_code == 201
    assert (await post(shared_client, email(body="é" * 32_768))).status_code == 201  # 2 bytes each
    assert fields_named(await post(shared_client, email(body="x" * 65_537))) == {"body"}
    assert fields_named(await post(shared_client, email(body="é" * 32_768 + "x"))) == {"body"}
    assert fields_named(await post(shared_client, email(body=""))) == {"body"}


async def test_a_subject_of_998_characters_is_accepted_and_999_is_named(
    shared_client: httpx.AsyncClient,
) -> None:
    assert (await post(shared_client, email(subject="s" * 998))).status_code == 201
    assert fields_named(await post(shared_client, email(subject="s" * 999))) == {"subject"}


async def test_an_idempotency_key_of_255_characters_is_accepted_and_256_is_named(
    shared_client: httpx.AsyncClient,
) -> None:
    longest = "k" * 255
    assert (
        await shared_client.post(
            "/notifications", json=email(), headers={"Idempotency-Key": longest}
        )
    ).status_code == 201
    assert (
        await shared_client.post("/notifications", json=email(idempotencyKey="b" * 255))
    ).status_code == 201
    too_long = await shared_client.post(
        "/notifications", json=email(), headers={"Idempotency-Key": "k" * 256}
    )
    assert fields_named(too_long) == {"Idempotency-Key"}
    assert fields_named(
        await shared_client.post("/notifications", json=email(idempotencyKey="b" * 256))
    ) == {"idempotencyKey"}


@pytest.mark.parametrize("bad", ["", "has space", "tab\there", "naïve", "line\n"])
async def test_idempotency_keys_must_be_printable_ascii(
    shared_client: httpx.AsyncClient, bad: str
) -> None:
    assert fields_named(
        await shared_client.post("/notifications", json=email(idempotencyKey=bad))
    ) == {"idempotencyKey"}


async def test_an_empty_idempotency_key_header_is_named(shared_client: httpx.AsyncClient) -> None:
    response = await shared_client.post(
        "/notifications", json=email(), headers={"Idempotency-Key": ""}
    )
    assert fields_named(response) == {"Idempotency-Key"}


async def test_send_at_and_delay_seconds_together_are_a_400(
    shared_client: httpx.AsyncClient,
) -> None:
    response = await post(shared_client, email(sendAt="2030-01-01T00:00:00Z", delaySeconds=5))
    assert fields_named(response) == {"sendAt"}


@pytest.mark.parametrize(
    "when",
    [
        "2030-01-01",
        "2030-01-01T00:00:00",  # no offset
        "2030-01-01 00:00:00Z",
        "2030-02-30T00:00:00Z",
        "2030-01-01T25:00:00Z",
        "yesterday",
        "9999-12-31T23:59:59-01:00",  # past year 9999 in UTC
        "2030-01-01T00:00:00Z\n",
    ],
)
async def test_send_at_and_expires_at_must_be_rfc3339_with_an_offset(
    shared_client: httpx.AsyncClient, when: str
) -> None:
    assert fields_named(await post(shared_client, email(sendAt=when))) == {"sendAt"}
    assert fields_named(await post(shared_client, email(expiresAt=when))) == {"expiresAt"}


async def test_rfc3339_with_offsets_and_nanoseconds_is_accepted(
    shared_client: httpx.AsyncClient,
) -> None:
    response = await post(shared_client, email(sendAt="2030-01-01T05:30:00.123456789+05:30"))
    assert response.json()["sendAt"] == "2030-01-01T00:00:00.123456Z"


async def test_delay_seconds_is_between_zero_and_one_year(shared_client: httpx.AsyncClient) -> None:
    year = 365 * 24 * 3600
    assert (await post(shared_client, email(delaySeconds=0))).status_code == 201
    assert (await post(shared_client, email(delaySeconds=year))).status_code == 201
    for bad in (-1, year + 1, 1.5, "10"):
        assert fields_named(await post(shared_client, email(delaySeconds=bad))) == {"delaySeconds"}


async def test_expires_at_must_be_after_the_send_time(shared_client: httpx.AsyncClient) -> None:
    at = "2030-01-01T00:00:00Z"
    assert fields_named(await post(shared_client, email(sendAt=at, expiresAt=at))) == {"expiresAt"}
    assert fields_named(
        await post(shared_client, email(sendAt=at, expiresAt="2029-12-31T23:59:59Z"))
    ) == {"expiresAt"}
    assert fields_named(
        await post(shared_client, email(delaySeconds=3600, expiresAt="2000-01-01T00:00:00Z"))
    ) == {"expiresAt"}
    assert (
        await post(shared_client, email(sendAt=at, expiresAt="2030-01-01T00:00:01Z"))
    ).status_code == 201


async def test_priority_is_one_of_the_three_names(shared_client: httpx.AsyncClient) -> None:
    for priority in ("HIGH", "NORMAL", "LOW"):
        assert (await post(shared_client, email(priority=priority))).json()["priority"] == priority
    assert (await post(shared_client, email())).json()["priority"] == "NORMAL"
    assert fields_named(await post(shared_client, email(priority="URGENT"))) == {"priority"}
    assert fields_named(await post(shared_client, email(priority=0))) == {"priority"}


async def test_metadata_up_to_16_kib_is_accepted_and_larger_is_named(
    shared_client: httpx.AsyncClient,
) -> None:
    overhead = len('{"k":""}')
    assert (
        await post(shared_client, email(metadata={"k": "v" * (16 * 1024 - overhead)}))
    ).status_code == 201
    assert fields_named(
        await post(shared_client, email(metadata={"k": "v" * (16 * 1024 - overhead + 1)}))
    ) == {"metadata"}
    assert fields_named(await post(shared_client, email(metadata=["not", "an", "object"]))) == {
        "metadata"
    }


async def test_webhook_url_must_be_http_or_https(shared_client: httpx.AsyncClient) -> None:
    assert (
        await post(shared_client, email(webhookUrl="https://hooks.example.com/n"))
    ).status_code == 201
    for bad in ("ftp://example.com", "example.com/hook", "https://", "https://ex ample.com"):
        assert fields_named(await post(shared_client, email(webhookUrl=bad))) == {"webhookUrl"}


async def test_policy_must_be_namespace_slash_name(shared_client: httpx.AsyncClient) -> None:
    assert (await post(shared_client, email(policy="team-a/default"))).status_code == 201
    for bad in ("default", "Team/x", "a/b/c", "a/", "team-a/default\n"):
        assert fields_named(await post(shared_client, email(policy=bad))) == {"policy"}


async def test_unknown_fields_are_named(shared_client: httpx.AsyncClient) -> None:
    assert fields_named(await post(shared_client, email(bogus=1, send_at="x"))) == {
        "bogus",
        "send_at",
    }


async def test_required_fields_are_named_when_missing(shared_client: httpx.AsyncClient) -> None:
    assert fields_named(await post(shared_client, {})) == {"channel", "recipient", "body"}


async def test_wrong_json_types_are_named(shared_client: httpx.AsyncClient) -> None:
    response = await post(
        shared_client, {"channel": "email", "recipient": 5, "body": ["x"], "subject": 1}
    )
    assert fields_named(response) == {"recipient", "body", "subject"}


async def test_every_bad_field_is_named_in_one_problem(shared_client: httpx.AsyncClient) -> None:
    response = await shared_client.post(
        "/notifications",
        json={
            "channel": "sms",
            "recipient": "not-a-number",
            "body": "",
            "subject": "s" * 999,
            "priority": "SOON",
            "sendAt": "tomorrow",
            "metadata": 1,
            "extra": True,
        },
        headers={"Idempotency-Key": "bad key"},
    )
    named = {"recipient", "body", "subject", "priority", "sendAt", "metadata", "extra"}
    assert fields_named(response) == named | {"Idempotency-Key"}
    problem = response.json()
    assert problem["type"].endswith("validation-failed") and problem["status"] == 400
    assert all(e["message"] for e in problem["errors"])


async def test_text_postgresql_cannot_store_is_named_not_stored(
    shared_client: httpx.AsyncClient,
) -> None:
    response = await post(
        shared_client, email(body="nul\x00byte", metadata={"a": {"b": ["ok", "x\x00"]}})
    )
    assert fields_named(response) == {"body", "metadata.a.b[1]"}
    raw = b'{"channel": "email", "recipient": "a@example.com", "body": "\\ud800 lone surrogate"}'
    lone = await shared_client.post(
        "/notifications",
        content=raw,
        headers={"Content-Type": "application/json", "Idempotency-Key": key()},
    )
    assert fields_named(lone) == {"body"}


async def test_metadata_nested_too_deeply_is_named(shared_client: httpx.AsyncClient) -> None:
    deep: Any = "leaf"
    for _ in range(40):
        deep = {"d": deep}
    response = await post(shared_client, email(metadata=deep))
    assert response.status_code == 400
    assert all(f.startswith("metadata") for f in fields_named(response))


@pytest.mark.parametrize(
    "subject",
    [
        "Hi\r\nReply-To: evil@example.net",
        "Hi\nBcc: evil@example.net",
        "nul\x00",
        "=?utf-8?q?Hi=0D=0AReply-To:_evil@example.net?=",
        "=?utf-8?b?SGkNClJlcGx5LVRvOiBldmlsQGV4YW1wbGUubmV0?=",
    ],
    ids=["crlf", "lf", "nul", "encoded-q", "encoded-b"],
)
async def test_a_subject_with_a_line_break_plain_or_encoded_is_named_and_nothing_stored(
    client: httpx.AsyncClient, subject: str
) -> None:
    """It would be a header of the client's own in the email (docs/security.md)."""
    for channel, recipient in (("email", "a@example.com"), ("push", "fcm:abc")):
        response = await post(
            client, {"channel": channel, "recipient": recipient, "subject": subject, "body": "x"}
        )
        assert fields_named(response) == {"subject"}
    listed = await client.get("/notifications")
    assert listed.status_code == 200 and listed.json()["items"] == []


async def test_a_template_whose_subject_renders_a_line_break_is_named_and_nothing_stored(
    client: httpx.AsyncClient,
) -> None:
    template = {"channels": {"email": {"subject": "Order {{ order }}", "body": "Total."}}}
    assert (await client.put("/templates/receipt", json=template)).status_code == 201
    for order in ("7\r\nReply-To: evil@example.net", "=?utf-8?q?7=0D=0AReply-To:_e@x.net?="):
        response = await post(
            client,
            {
                "channel": "email",
                "recipient": "a@example.com",
                "template": "receipt",
                "data": {"order": order},
            },
        )
        assert response.status_code == 400
        [error] = response.json()["errors"]
        assert error["field"] == "data" and "email subject must not hold" in error["message"]
    listed = await client.get("/notifications")
    assert listed.status_code == 200 and listed.json()["items"] == []
    ok = {
        "channel": "email",
        "recipient": "a@example.com",
        "template": "receipt",
        "data": {"order": 7},
    }
    assert (await post(client, ok)).status_code == 201


async def test_a_subject_with_a_tab_or_an_encoded_word_without_line_breaks_is_accepted(
    shared_client: httpx.AsyncClient,
) -> None:
    for subject in ("a\ttab", "=?utf-8?q?caf=C3=A9?=", "Grüße"):
        assert (await post(shared_client, email(subject=subject))).status_code == 201
