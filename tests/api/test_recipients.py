"""Recipients, preferences and templates over the API (CONTRACT §9, docs/recipients.md).

CRUD and validation of recipients and templates, and user-targeted sends: expansion over the
recipient's channels, opt-outs per channel and per category, `strategy: first`, a request whose
every channel is opted out stored as one SUPPRESSED notification with its webhook event,
idempotent repeats, and templates rendered at creation (strict variables, sandbox, no
autoescaping, a later edit not touching queued text, a render bound crossed a 400 naming the
rule).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from tests.api.support import PROBLEM, api_client, fields_named, key, sql

FULL = {
    "email": "ada@example.com",
    "phone": "+4915112345678",
    "pushTokens": ["device-1", "device-0"],
    "timezone": "Europe/Berlin",
}


async def put_recipient(http: httpx.AsyncClient, id: str, **body: Any) -> dict[str, Any]:
    response = await http.put(f"/recipients/{id}", json={**FULL, **body})
    assert response.status_code in (200, 201), response.text
    result: dict[str, Any] = response.json()
    return result


async def send(
    http: httpx.AsyncClient, expected: int = 201, idempotency_key: str | None = None, **body: Any
) -> list[dict[str, Any]]:
    fields = {"body": "hello"} if "template" not in body else {}
    response = await http.post(
        "/notifications",
        json={**fields, **body},
        headers={"Idempotency-Key": idempotency_key or key()},
    )
    assert response.status_code == expected, response.text
    notifications: list[dict[str, Any]] = response.json()["notifications"]
    return notifications


# --- recipients -------------------------------------------------------------------------------


async def test_a_recipient_is_created_replaced_read_and_deleted(client: httpx.AsyncClient) -> None:
    first = await client.put(
        "/recipients/user-1",
        json={**FULL, "preferences": {"quietHours": {"start": "22:00", "end": "07:00"}}},
    )
    assert first.status_code == 201, first.text
    assert first.json()["preferences"] == {
        "optOut": {"channels": [], "categories": [], "all": False},
        "quietHours": {"start": "22:00", "end": "07:00"},
    }
    again = await client.put("/recipients/user-1", json={"email": "new@example.com"})
    assert again.status_code == 200
    replaced = (await client.get("/recipients/user-1")).json()
    assert replaced["email"] == "new@example.com"
    assert replaced["phone"] is None and replaced["pushTokens"] == []
    assert replaced["timezone"] == "UTC" and replaced["preferences"]["quietHours"] is None
    assert (await client.delete("/recipients/user-1")).status_code == 204
    missing = await client.get("/recipients/user-1")
    assert missing.status_code == 404 and missing.headers["content-type"] == PROBLEM
    assert (await client.delete("/recipients/user-1")).status_code == 404


async def test_a_recipient_is_validated_like_a_notification(client: httpx.AsyncClient) -> None:
    response = await client.put(
        "/recipients/u-2",
        json={
            "email": "not-an-address",
            "phone": "0151 123",
            "timezone": "Mars/Olympus",
            "pushTokens": ["a", "a"],
            "nickname": "x",
            "preferences": {"quietHours": {"start": "25:00", "end": "7:00"}},
        },
    )
    assert fields_named(response) == {
        "email",
        "phone",
        "timezone",
        "pushTokens",
        "nickname",
        "preferences.quietHours.start",
        "preferences.quietHours.end",
    }
    same = await client.put(
        "/recipients/u-2", json={"preferences": {"quietHours": {"start": "07:00", "end": "07:00"}}}
    )
    assert fields_named(same) == {"preferences.quietHours"}
    assert fields_named(await client.put("/recipients/a%20b", json={})) == {"id"}


async def test_patching_preferences_merges_what_is_given_and_keeps_the_rest(
    client: httpx.AsyncClient,
) -> None:
    await put_recipient(
        client,
        "u-3",
        preferences={
            "optOut": {"channels": ["sms"], "categories": ["marketing"]},
            "quietHours": {"start": "22:00", "end": "07:00"},
        },
    )
    patched = await client.patch("/recipients/u-3/preferences", json={"optOut": {"all": True}})
    assert patched.status_code == 200, patched.text
    assert patched.json()["preferences"] == {
        "optOut": {"channels": ["sms"], "categories": ["marketing"], "all": True},
        "quietHours": {"start": "22:00", "end": "07:00"},
    }
    cleared = await client.patch(
        "/recipients/u-3/preferences", json={"optOut": {"channels": []}, "quietHours": None}
    )
    assert cleared.json()["preferences"] == {
        "optOut": {"channels": [], "categories": ["marketing"], "all": True},
        "quietHours": None,
    }
    assert fields_named(
        await client.patch("/recipients/u-3/preferences", json={"optOut": {"channel": ["sms"]}})
    ) == {"optOut.channel"}
    gone = await client.patch("/recipients/nobody/preferences", json={})
    assert gone.status_code == 404


# --- user-targeted sends ----------------------------------------------------------------------


async def test_a_recipient_id_expands_to_one_notification_per_channel_with_a_contact(
    client: httpx.AsyncClient,
) -> None:
    await put_recipient(client, "u-4")
    made = await send(client, idempotency_key="welcome-u-4", recipientId="u-4", subject="Hi")
    assert [(n["channel"], n["recipient"]) for n in made] == [
        ("email", "ada@example.com"),
        ("sms", "+4915112345678"),
        ("push", "device-1"),  # the first token
    ]
    assert [n["idempotencyKey"] for n in made] == [
        "welcome-u-4 email",
        "welcome-u-4 sms",
        "welcome-u-4 push",
    ]
    assert {(n["status"], n["recipientId"], n["category"]) for n in made} == {
        ("PENDING", "u-4", "transactional")
    }
    # The same request again: the same notifications, even though the preferences changed since.
    await client.patch("/recipients/u-4/preferences", json={"optOut": {"all": True}})
    again = await send(client, 200, idempotency_key="welcome-u-4", recipientId="u-4", subject="Hi")
    assert [n["id"] for n in again] == [n["id"] for n in made]
    other = await client.post(
        "/notifications",
        json={"recipientId": "u-4", "body": "another text"},
        headers={"Idempotency-Key": "welcome-u-4"},
    )
    assert other.status_code == 409 and other.json()["existingId"] == made[0]["id"]
    listed = (await client.get("/notifications", params={"recipientId": "u-4"})).json()
    # Made in one transaction (one createdAt): listed in id order, so compared as a set.
    assert {n["id"] for n in listed["items"]} == {n["id"] for n in made}


async def test_channels_follow_the_requested_order_and_skip_missing_contacts(
    client: httpx.AsyncClient,
) -> None:
    await put_recipient(client, "u-5", phone=None)
    made = await send(client, recipientId="u-5", channels=["push", "sms", "email"])
    assert [n["channel"] for n in made] == ["push", "email"]


async def test_an_opted_out_channel_is_skipped(client: httpx.AsyncClient) -> None:
    await put_recipient(client, "u-6", preferences={"optOut": {"channels": ["sms", "push"]}})
    made = await send(client, recipientId="u-6")
    assert [n["channel"] for n in made] == ["email"]


async def test_an_opted_out_category_is_suppressed_and_others_still_go(
    client: httpx.AsyncClient,
) -> None:
    await put_recipient(client, "u-7", preferences={"optOut": {"categories": ["marketing"]}})
    receipts = await send(client, recipientId="u-7", channels=["email"])
    assert [n["status"] for n in receipts] == ["PENDING"]
    (ad,) = await send(client, recipientId="u-7", category="marketing", channels=["email", "sms"])
    assert ad["status"] == "SUPPRESSED" and ad["category"] == "marketing"
    assert "opted out of category marketing" in ad["lastError"]


async def test_strategy_first_sends_on_the_first_allowed_channel_only(
    client: httpx.AsyncClient,
) -> None:
    await put_recipient(client, "u-8", preferences={"optOut": {"channels": ["push"]}})
    made = await send(
        client, recipientId="u-8", channels=["push", "sms", "email"], strategy="first"
    )
    assert [n["channel"] for n in made] == ["sms"]


async def test_a_request_opted_out_everywhere_is_one_suppressed_notification_with_an_event(
    client: httpx.AsyncClient, database_url: str
) -> None:
    await put_recipient(client, "u-9", preferences={"optOut": {"all": True}})
    (suppressed,) = await send(client, recipientId="u-9", webhookUrl="https://hooks.example/nq")
    assert suppressed["status"] == "SUPPRESSED"
    assert suppressed["idempotencyKey"].endswith(" suppressed")
    assert "opted out of everything" in suppressed["lastError"]
    events = await sql(
        database_url,
        "SELECT url, payload::json->>'status' FROM nq_webhook_events WHERE notification_id = %s",
        (suppressed["id"],),
    )
    assert events == [("https://hooks.example/nq", "SUPPRESSED")]
    status = (await client.get("/status")).json()
    assert status["counts"]["SUPPRESSED"] == 1


async def test_recipient_and_recipient_id_together_or_an_unknown_recipient_are_400(
    client: httpx.AsyncClient,
) -> None:
    both = await client.post(
        "/notifications",
        json={"recipientId": "u", "recipient": "a@example.com", "channel": "email", "body": "x"},
        headers={"Idempotency-Key": key()},
    )
    assert fields_named(both) >= {"recipient"}
    unknown = await client.post(
        "/notifications",
        json={"recipientId": "nobody", "body": "x"},
        headers={"Idempotency-Key": key()},
    )
    assert fields_named(unknown) == {"recipientId"}
    strategy = await client.post(
        "/notifications",
        json={"channel": "email", "recipient": "a@example.com", "body": "x", "strategy": "first"},
        headers={"Idempotency-Key": key()},
    )
    assert fields_named(strategy) == {"strategy"}


async def test_a_batch_mixes_addressed_and_user_targeted_items(client: httpx.AsyncClient) -> None:
    await put_recipient(client, "u-10")
    response = await client.post(
        "/notifications/batch",
        json={
            "notifications": [
                {"idempotencyKey": "b-1", "recipientId": "u-10", "channels": ["sms"], "body": "a"},
                {
                    "idempotencyKey": "b-2",
                    "channel": "email",
                    "recipient": "x@example.com",
                    "body": "b",
                },
                {"idempotencyKey": "b-3", "recipientId": "nobody", "body": "c"},
                {"idempotencyKey": "b-1", "recipientId": "u-10", "channels": ["sms"], "body": "a"},
            ]
        },
    )
    results = response.json()["results"]
    assert [r["status"] for r in results] == [201, 201, 400, 200]
    assert [n["channel"] for n in results[0]["notifications"]] == ["sms"]
    assert results[3]["notifications"][0]["id"] == results[0]["notifications"][0]["id"]
    assert results[1]["notification"]["recipient"] == "x@example.com"


# --- templates --------------------------------------------------------------------------------

RECEIPT = {
    "channels": {
        "email": {"subject": "Order {{ order }}", "body": "Hello {{ name }}, total {{ total }}."},
        "sms": {"body": "Order {{ order }}: {{ total }}"},
    }
}


async def test_a_template_version_moves_only_when_its_content_changes(
    client: httpx.AsyncClient,
) -> None:
    created = await client.put("/templates/receipt", json=RECEIPT)
    assert created.status_code == 201 and created.json()["version"] == 1
    same = await client.put("/templates/receipt", json=RECEIPT)
    assert same.status_code == 200 and same.json()["version"] == 1
    changed = await client.put(
        "/templates/receipt", json={"channels": {"sms": {"body": "Order {{ order }}"}}}
    )
    assert changed.json()["version"] == 2
    assert (await client.get("/templates/receipt")).json()["channels"] == {
        "sms": {"body": "Order {{ order }}"}
    }
    assert (await client.delete("/templates/receipt")).status_code == 204
    assert (await client.get("/templates/receipt")).status_code == 404


async def test_a_template_is_validated(client: httpx.AsyncClient) -> None:
    response = await client.put(
        "/templates/bad",
        json={
            "channels": {
                "email": {"body": "{% if %}"},
                "sms": {"subject": "no", "body": "x"},
                "fax": {"body": "x"},
            }
        },
    )
    assert fields_named(response) == {
        "channels.email.body",
        "channels.sms.subject",
        "channels.fax",
    }
    assert fields_named(await client.put("/templates/Bad_Name", json=RECEIPT)) == {"name"}


async def test_a_template_is_rendered_at_creation_as_plain_text_in_a_sandbox(
    client: httpx.AsyncClient,
) -> None:
    await client.put(
        "/templates/markup",
        json={
            "channels": {
                "email": {
                    "subject": "For {{ name }}",
                    "body": "raw={{ name }} escaped={{ name | e }}",
                }
            }
        },
    )
    response = await client.post(
        "/notifications",
        json={
            "channel": "email",
            "recipient": "a@example.com",
            "template": "markup",
            "data": {"name": "<b>Tom & {{ 7*7 }}</b>"},
        },
        headers={"Idempotency-Key": key()},
    )
    assert response.status_code == 201, response.text
    n = response.json()
    # Plain text: no autoescaping; `| e` escapes on request; data is never run as template code.
    assert n["body"] == "raw=<b>Tom & {{ 7*7 }}</b> escaped=&lt;b&gt;Tom &amp; {{ 7*7 }}&lt;/b&gt;"
    assert n["subject"] == "For <b>Tom & {{ 7*7 }}</b>"
    assert n["template"] == {"name": "markup", "version": 1}
    await client.put(
        "/templates/escape", json={"channels": {"sms": {"body": "{{ ''.__class__.__mro__ }}"}}}
    )
    sandboxed = await client.post(
        "/notifications",
        json={"channel": "sms", "recipient": "+4915112345678", "template": "escape", "data": {}},
        headers={"Idempotency-Key": key()},
    )
    # The sandbox refuses Python internals: a 400 naming the template, never a rendered object.
    assert fields_named(sandboxed) == {"template"}
    assert "unsafe" in sandboxed.json()["errors"][0]["message"]


async def test_a_missing_variable_is_a_400_at_creation(client: httpx.AsyncClient) -> None:
    await client.put("/templates/receipt", json=RECEIPT)
    await put_recipient(client, "u-11", preferences={"optOut": {"channels": ["sms"]}})
    response = await client.post(
        "/notifications",
        json={"recipientId": "u-11", "template": "receipt", "data": {"order": 1, "name": "Ada"}},
        headers={"Idempotency-Key": key()},
    )
    assert fields_named(response) == {"data"}
    assert "'total' is undefined" in response.json()["errors"][0]["message"]
    unknown = await client.post(
        "/notifications",
        json={"channel": "sms", "recipient": "+4915112345678", "template": "nope", "data": {}},
        headers={"Idempotency-Key": key()},
    )
    assert fields_named(unknown) == {"template"}
    both = await client.post(
        "/notifications",
        json={"channel": "sms", "recipient": "+4915112345678", "template": "receipt", "body": "x"},
        headers={"Idempotency-Key": key()},
    )
    assert fields_named(both) == {"template"}


async def test_editing_a_template_does_not_change_queued_notifications(
    client: httpx.AsyncClient,
) -> None:
    await client.put("/templates/receipt", json=RECEIPT)
    await put_recipient(client, "u-12")
    data = {"order": 7, "name": "Ada", "total": "9 EUR"}
    first = await send(client, recipientId="u-12", template="receipt", data=data)
    # Only the channels the template has an entry for.
    assert [(n["channel"], n["body"]) for n in first] == [
        ("email", "Hello Ada, total 9 EUR."),
        ("sms", "Order 7: 9 EUR"),
    ]
    assert first[0]["subject"] == "Order 7"
    await client.put(
        "/templates/receipt",
        json={"channels": {"email": {"subject": "New", "body": "Changed {{ name }}"}}},
    )
    queued = (await client.get(f"/notifications/{first[0]['id']}")).json()
    assert queued["body"] == "Hello Ada, total 9 EUR." and queued["template"]["version"] == 1
    (second,) = await send(client, recipientId="u-12", template="receipt", data=data)
    assert second["body"] == "Changed Ada" and second["template"] == {
        "name": "receipt",
        "version": 2,
    }


async def test_identical_user_targeted_requests_at_once_expand_once(
    client: httpx.AsyncClient, database_url: str
) -> None:
    await put_recipient(client, "u-13")
    responses = await asyncio.gather(
        *[
            client.post(
                "/notifications",
                json={"recipientId": "u-13", "body": "once"},
                headers={"Idempotency-Key": "burst-1"},
            )
            for _ in range(10)
        ]
    )
    assert sorted(r.status_code for r in responses) == [200] * 9 + [201]
    assert len({tuple(n["id"] for n in r.json()["notifications"]) for r in responses}) == 1
    rows = await sql(
        database_url, "SELECT count(*) FROM nq_all_notifications WHERE recipient_id = 'u-13'"
    )
    assert rows == [(3,)]


async def test_a_notification_suppressed_at_creation_reports_to_the_default_webhook(
    database_url: str, db: Any
) -> None:
    async with api_client(database_url, db=db, webhook_url="https://default.example/hook") as http:
        await put_recipient(http, "u-14", preferences={"optOut": {"all": True}})
        (suppressed,) = await send(http, recipientId="u-14")
    events = await sql(
        database_url,
        "SELECT url FROM nq_webhook_events WHERE notification_id = %s",
        (suppressed["id"],),
    )
    assert events == [("https://default.example/hook",)]


async def test_a_template_past_a_render_bound_is_a_400_naming_the_rule_the_rest_go_on(
    client: httpx.AsyncClient,
) -> None:
    # Through the app's render pool (worker processes): in a batch, by address and by recipientId.
    bomb = {"channels": {"email": {"subject": "hi", "body": "{{ 'x' * 10**9 }}"}}}
    assert (await client.put("/templates/bomb", json=bomb)).status_code == 201
    assert (await client.put("/templates/receipt", json=RECEIPT)).status_code == 201
    await put_recipient(client, "u-bomb")
    data = {"order": 7, "name": "Ada", "total": 3}
    response = await client.post(
        "/notifications/batch",
        json={
            "notifications": [
                {
                    "idempotencyKey": "b-1",
                    "channel": "email",
                    "recipient": "a@example.com",
                    "template": "bomb",
                    "data": {},
                },
                {
                    "idempotencyKey": "b-2",
                    "channel": "email",
                    "recipient": "a@example.com",
                    "template": "receipt",
                    "data": data,
                },
                {"idempotencyKey": "b-3", "recipientId": "u-bomb", "template": "bomb", "data": {}},
                {
                    "idempotencyKey": "b-4",
                    "channel": "email",
                    "recipient": "a@example.com",
                    "template": "receipt",
                    "data": {**data, "total": "{{ 1 / 0 }}"},
                },
                {
                    "idempotencyKey": "b-5",
                    "channel": "sms",
                    "recipient": "+4915112345678",
                    "template": "receipt",
                    "data": {"order": 1, "total": 0, "name": "x"},
                },
            ]
        },
    )
    results = response.json()["results"]
    assert [r["status"] for r in results] == [400, 201, 400, 201, 201]
    for index in (0, 2):
        [error] = results[index]["error"]["errors"]
        assert error["field"] == f"notifications[{index}].template"
        assert error["message"].startswith("email body: exceeds the value size bound")
    # Data is text, never template code: `{{ 1 / 0 }}` in data is printed, not run.
    assert results[3]["notification"]["body"] == "Hello Ada, total {{ 1 / 0 }}."
    await client.put("/templates/divide", json={"channels": {"sms": {"body": "{{ n / 0 }}"}}})
    divided = await client.post(
        "/notifications",
        json={
            "channel": "sms",
            "recipient": "+4915112345678",
            "template": "divide",
            "data": {"n": 1},
        },
        headers={"Idempotency-Key": key()},
    )
    # An error of the data that is not a missing variable: a 400 on data, no longer a 500.
    assert fields_named(divided) == {"data"}
    assert "ZeroDivisionError" in divided.json()["errors"][0]["message"]
