"""Escalation until acknowledged over the API (CONTRACT section 10, docs/escalation.md): the
create (one notification per step, later steps waiting EscalationStep with the reason written by
the insert), idempotent repeats and key clashes, validation, the acknowledgement (steps not yet
sent CANCELLED `acknowledged`, twice harmless, unknown 404), the state read back, the voice
channel and the recipient's voice number. The race with a real worker is in
tests/test_escalation_race.py."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from tests.api.support import PROBLEM, fields_named, key, sql

RECIPIENT = {"email": "ada@example.com", "phone": "+4915112345678", "pushTokens": ["device-1"]}
STEPS = [
    {"channel": "push"},
    {"channel": "sms", "afterSeconds": 300},
    {"channel": "voice", "afterSeconds": 600},
]


async def recipient(http: httpx.AsyncClient, **fields: Any) -> str:
    id = f"u-{uuid.uuid4().hex[:8]}"
    response = await http.put(f"/recipients/{id}", json={**RECIPIENT, **fields})
    assert response.status_code == 201, response.text
    return id


async def escalate(
    http: httpx.AsyncClient, expected: int = 201, idempotency_key: str | None = None, **body: Any
) -> httpx.Response:
    response = await http.post(
        "/notifications",
        json={"body": "disk full on db-1", **body},
        headers={"Idempotency-Key": idempotency_key or key()},
    )
    assert response.status_code == expected, response.text
    return response


async def test_a_create_with_escalation_makes_one_notification_per_step_later_ones_waiting(
    shared_client: httpx.AsyncClient, shared_database_url: str
) -> None:
    user = await recipient(shared_client, voice="+4930123456")
    answer = (await escalate(shared_client, recipientId=user, escalation={"steps": STEPS})).json()
    assert answer["escalation"]["state"] == "active"
    steps = answer["notifications"]
    assert [n["channel"] for n in steps] == ["push", "sms", "voice"]
    assert [n["recipient"] for n in steps] == ["device-1", "+4915112345678", "+4930123456"]
    assert steps[0]["waiting"] is None  # due now
    for n, after in zip(steps[1:], (300, 600), strict=True):
        assert n["waiting"]["reason"] == "EscalationStep"
        assert n["waiting"]["until"] == n["sendAt"]
        assert f"{after} s after the creation" in n["waiting"]["detail"]
    # The reason was written by the insert itself: the rows were never updated since.
    rows = await sql(
        shared_database_url,
        "SELECT waiting_reason, escalation_id::text, created_at = updated_at FROM nq_jobs"
        " WHERE id = ANY(%s) ORDER BY send_at",
        ([uuid.UUID(n["id"]) for n in steps],),
    )
    assert [r[0] for r in rows] == [None, "EscalationStep", "EscalationStep"]
    assert {r[1] for r in rows} == {answer["escalation"]["id"]}
    assert all(r[2] for r in rows)
    listed = await shared_client.get("/notifications", params={"waiting": "EscalationStep"})
    assert {steps[1]["id"], steps[2]["id"]} <= {n["id"] for n in listed.json()["items"]}


async def test_acknowledging_cancels_every_unsent_step_and_a_second_time_changes_nothing(
    shared_client: httpx.AsyncClient,
) -> None:
    user = await recipient(shared_client)
    answer = (await escalate(shared_client, recipientId=user, escalation={"steps": STEPS})).json()
    id = answer["escalation"]["id"]
    first = await shared_client.post(f"/escalations/{id}/acknowledge", json={"by": "ana"})
    assert first.status_code == 200, first.text
    acked = first.json()
    assert acked["state"] == "acknowledged" and acked["acknowledgedBy"] == "ana"
    assert acked["acknowledgedAt"] is not None
    assert [n["status"] for n in acked["notifications"]] == ["CANCELLED"] * 3
    assert {n["lastError"] for n in acked["notifications"]} == {"acknowledged"}
    again = await shared_client.post(f"/escalations/{id}/acknowledge")  # no body
    assert again.status_code == 200
    assert again.json() == acked
    read = await shared_client.get(f"/escalations/{id}")
    assert read.status_code == 200 and read.json() == acked


async def test_an_unknown_escalation_is_404_and_a_bad_id_or_body_400(
    shared_client: httpx.AsyncClient,
) -> None:
    for call in (
        shared_client.get(f"/escalations/{uuid.uuid4()}"),
        shared_client.post(f"/escalations/{uuid.uuid4()}/acknowledge"),
    ):
        response = await call
        assert response.status_code == 404
        assert response.headers["content-type"] == PROBLEM
    assert (await shared_client.get("/escalations/not-a-uuid")).status_code == 400
    bad = await shared_client.post(f"/escalations/{uuid.uuid4()}/acknowledge", json={"who": 1})
    assert fields_named(bad) == {"who"}


async def test_the_same_request_again_answers_the_escalation_and_another_under_its_key_409(
    shared_client: httpx.AsyncClient,
) -> None:
    user = await recipient(shared_client)
    k = key()
    body = {"recipientId": user, "escalation": {"steps": STEPS}}
    first = (await escalate(shared_client, idempotency_key=k, **body)).json()
    second = (await escalate(shared_client, 200, idempotency_key=k, **body)).json()
    assert second["escalation"]["id"] == first["escalation"]["id"]
    assert [n["id"] for n in second["notifications"]] == [n["id"] for n in first["notifications"]]
    await escalate(
        shared_client, 409, idempotency_key=k, recipientId=user, escalation={"steps": STEPS[:1]}
    )
    plain = await shared_client.post(
        "/notifications",
        json={"channel": "email", "recipient": "a@example.com", "body": "x"},
        headers={"Idempotency-Key": k},
    )
    assert plain.status_code == 409
    targeted = await shared_client.post(
        "/notifications", json={"recipientId": user, "body": "x"}, headers={"Idempotency-Key": k}
    )
    assert targeted.status_code == 409


async def test_escalation_requests_are_validated_naming_each_field(
    shared_client: httpx.AsyncClient,
) -> None:
    user = await recipient(shared_client, phone=None)
    cases: list[tuple[dict[str, Any], set[str]]] = [
        (
            {"escalation": {"steps": STEPS}, "channel": "email", "recipient": "a@b.co"},
            {"escalation"},
        ),
        ({"recipientId": user, "escalation": {"steps": []}}, {"escalation.steps"}),
        ({"recipientId": user, "escalation": {"steps": STEPS * 4}}, {"escalation.steps"}),
        (
            {"recipientId": user, "escalation": {"steps": list(reversed(STEPS))}},
            {"escalation.steps"},
        ),
        (
            {"recipientId": user, "escalation": {"steps": [{"channel": "fax"}]}},
            {"escalation.steps.0.channel"},
        ),
        (
            {
                "recipientId": user,
                "escalation": {"steps": [{"channel": "sms", "afterSeconds": -1}]},
            },
            {"escalation.steps.0.afterSeconds"},
        ),
        ({"recipientId": user, "escalation": {"steps": STEPS, "x": 1}}, {"escalation.x"}),
        ({"recipientId": user, "escalation": {"steps": STEPS}, "delaySeconds": 5}, {"escalation"}),
        (
            {"recipientId": user, "escalation": {"steps": STEPS}, "channels": ["sms"]},
            {"escalation"},
        ),
        # No phone: neither the sms nor the voice step has a contact.
        (
            {"recipientId": user, "escalation": {"steps": STEPS}},
            {"escalation.steps.1.channel", "escalation.steps.2.channel"},
        ),
        ({"recipientId": "nobody", "escalation": {"steps": STEPS}}, {"recipientId"}),
    ]
    for body, named in cases:
        response = await escalate(shared_client, 400, **body)
        assert fields_named(response) == named, (body, response.json())
    batch = await shared_client.post(
        "/notifications/batch",
        json={
            "notifications": [
                {
                    "recipientId": user,
                    "body": "x",
                    "idempotencyKey": key(),
                    "escalation": {"steps": STEPS[:1]},
                }
            ]
        },
    )
    assert batch.json()["results"][0]["status"] == 400


async def test_voice_is_a_channel_with_an_e164_recipient(shared_client: httpx.AsyncClient) -> None:
    made = await shared_client.post(
        "/notifications",
        json={"channel": "voice", "recipient": "+4930123456", "body": "call"},
        headers={"Idempotency-Key": key()},
    )
    assert made.status_code == 201 and made.json()["channel"] == "voice"
    bad = await shared_client.post(
        "/notifications",
        json={"channel": "voice", "recipient": "030 123", "body": "call"},
        headers={"Idempotency-Key": key()},
    )
    assert fields_named(bad) == {"recipient"}
    assert "for channel voice" in bad.json()["errors"][0]["message"]
    # A recipient's default channels stay email, sms, push: a call only when asked for.
    user = await recipient(shared_client)
    default = (await escalate(shared_client, recipientId=user)).json()["notifications"]
    assert [n["channel"] for n in default] == ["email", "sms", "push"]
    asked = await escalate(shared_client, recipientId=user, channels=["voice"])
    assert [n["recipient"] for n in asked.json()["notifications"]] == ["+4915112345678"]
    wrong = await shared_client.put(f"/recipients/{user}", json={"voice": "nope"})
    assert fields_named(wrong) == {"voice"}
