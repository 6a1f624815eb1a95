"""Delivery receipts through real processes (docs/receipts.md): a `notify-queue api` and a
`notify-queue worker` share a providers file; the worker sends through an HTTP provider that
answers message ids; vendors' requests are signed here with keys and certificates made by the
test. For each scheme: a signed receipt sets the notification's `delivery` (its status stays
SENT), writes a `"type": "delivery"` webhook event and counts in the metrics; a repeat changes
nothing; an unknown message id is counted and dropped; unsigned, tampered and replayed requests
are 401 and change nothing."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from tests.api.support import sql
from tests.receipts.stack import (
    Stack,
    form_body,
    sendgrid,
    sns_message,
    sns_sign,
    stack,
    standard_webhooks,
    twilio,
)
from tests.support import eventually


async def _untouched(s: Stack, database_url: str, id_: str) -> None:
    assert (await s.api.get(f"/notifications/{id_}")).json()["delivery"] is None
    assert await sql(database_url, "SELECT count(*) FROM nq_delivery_receipts") == [(0,)]
    assert await sql(database_url, "SELECT count(*) FROM nq_suppressions") == [(0,)]


async def _delivery_event(s: Stack, id_: str) -> dict[str, Any]:
    async def arrived() -> list[dict[str, Any]]:
        return await s.delivery_events(id_)

    [event] = await eventually(arrived, timeout=30)
    assert isinstance(event, dict)
    return event


async def test_a_sendgrid_batch_is_verified_matched_recorded_once_and_counted(
    database_url: str, tmp_path: Path
) -> None:
    async with stack(database_url, tmp_path) as s:
        sent = await s.sent(channel="email", recipient="ann@example.com", body="hi")
        assert sent["status"] == "SENT" and sent["provider"] == "sg"
        assert sent["delivery"] is None
        message_id = sent["providerMessageId"]
        events = [
            {
                "email": "ann@example.com",
                "timestamp": 1_765_000_000,
                "event": "delivered",
                "sg_message_id": f"{message_id}.filterdrecv-5645d9c87f-78xgx-1-5E3B4F3C-1.0",
            },
            {
                "email": "x@example.com",
                "timestamp": 1_765_000_001,
                "event": "delivered",
                "sg_message_id": "nobody-knows-this.filter",
            },
            {
                "email": "ann@example.com",
                "timestamp": 1_765_000_002,
                "event": "open",
                "sg_message_id": f"{message_id}.filter",
            },
        ]
        body = json.dumps(events).encode()
        url = "/providers/sg/events"
        key = s.vendor.sendgrid_key

        unsigned = await s.api.post(url, content=body, headers={"content-type": "application/json"})
        tampered_body = body.replace(b"delivered", b"bounce", 1)
        tampered = await s.api.post(url, content=tampered_body, headers=sendgrid(key, body))
        replayed = await s.api.post(
            url, content=body, headers=sendgrid(key, body, at=int(time.time()) - 301)
        )
        other_key = await s.api.post(
            url,
            content=body,
            headers=sendgrid(ec.generate_private_key(ec.SECP256R1()), body),
        )
        for refused in (unsigned, tampered, replayed, other_key):
            assert refused.status_code == 401, refused.text
            assert refused.headers["content-type"] == "application/problem+json"
        await _untouched(s, database_url, sent["id"])

        accepted = await s.api.post(url, content=body, headers=sendgrid(key, body))
        assert accepted.status_code == 200, accepted.text
        assert accepted.json() == {"received": 2, "matched": 1, "changed": 1}
        found = (await s.api.get(f"/notifications/{sent['id']}")).json()
        assert found["status"] == "SENT"
        assert found["delivery"] == {
            "state": "delivered",
            "at": "2025-12-06T05:46:40Z",
            "reason": None,
        }
        event = await _delivery_event(s, sent["id"])
        assert event["delivery"] == found["delivery"] and event["status"] == "SENT"
        assert event["provider"] == "sg"

        again = await s.api.post(url, content=body, headers=sendgrid(key, body))
        assert again.json() == {"received": 2, "matched": 1, "changed": 0}
        assert await sql(
            database_url,
            "SELECT count(*) FROM nq_webhook_events WHERE payload::jsonb->>'type' = 'delivery'",
        ) == [(1,)]

        metrics = (await s.api.get("/metrics")).text
        assert (
            'notify_queue_delivery_receipts_total{provider="sg",state="delivered"} 2.0' in metrics
        )
        assert 'notify_queue_delivery_receipts_total{provider="sg",state="unknown"} 2.0' in metrics

        assert (await s.api.post("/providers/nobody/events", content=body)).status_code == 404


async def test_twilio_status_callbacks_are_verified_over_the_public_url(
    database_url: str, tmp_path: Path
) -> None:
    async with stack(database_url, tmp_path) as s:
        sent = await s.sent(channel="sms", recipient="+15551234567", body="code 1234")
        assert sent["provider"] == "tw"
        path = "/providers/tw/events"
        form = {
            "MessageSid": sent["providerMessageId"],
            "MessageStatus": "undelivered",
            "ErrorCode": "30006",
            "To": "+15551234567",
        }
        signed = twilio(path, form)

        tampered = await s.api.post(
            path, content=form_body({**form, "ErrorCode": "30001"}), headers=signed
        )
        wrong_url = await s.api.post(path + "?x=1", content=form_body(form), headers=signed)
        wrong_token = await s.api.post(
            path, content=form_body(form), headers=twilio(path, form, token="not-it")
        )
        for refused in (tampered, wrong_url, wrong_token):
            assert refused.status_code == 401, refused.text
        await _untouched(s, database_url, sent["id"])

        accepted = await s.api.post(path, content=form_body(form), headers=signed)
        assert accepted.json() == {"received": 1, "matched": 1, "changed": 1}
        found = (await s.api.get(f"/notifications/{sent['id']}")).json()
        assert found["delivery"]["state"] == "bounced"
        assert found["delivery"]["reason"] == "undelivered (error 30006)"
        suppressions = (await s.api.get("/suppressions", params={"channel": "sms"})).json()
        assert [(i["address"], i["reason"]) for i in suppressions["items"]] == [
            ("+15551234567", "bounced")
        ]

        # A status that says nothing about the outcome yet is signed and ignored.
        queued = {"MessageSid": sent["providerMessageId"], "MessageStatus": "sent"}
        answer = await s.api.post(path, content=form_body(queued), headers=twilio(path, queued))
        assert answer.json() == {"received": 0, "matched": 0, "changed": 0}


async def test_ses_events_through_sns_signature_versions_1_and_2(
    database_url: str, tmp_path: Path
) -> None:
    async with stack(database_url, tmp_path, email="ses") as s:
        sent = await s.sent(channel="email", recipient="Bob@Example.com", body="hello")
        assert sent["provider"] == "ses"
        path = "/providers/ses/events"
        mail = {"messageId": sent["providerMessageId"], "destination": ["Bob@Example.com"]}
        delivery = {
            "eventType": "Delivery",
            "mail": mail,
            "delivery": {"timestamp": "2026-12-07T10:00:00.000Z"},
        }
        complaint = {
            "notificationType": "Complaint",
            "mail": mail,
            "complaint": {
                "timestamp": "2026-12-07T10:05:00.000Z",
                "complaintFeedbackType": "abuse",
            },
        }
        key = s.vendor.sns_key

        v1 = sns_message(key, delivery, version="1")
        tampered = {**v1, "Message": v1["Message"].replace("Delivery", "Bounce")}
        unsigned = {k: v for k, v in v1.items() if k != "Signature"}
        unknown_version = {**v1, "SignatureVersion": "3"}
        for refused in (tampered, unsigned, unknown_version):
            answer = await s.api.post(path, content=json.dumps(refused))
            assert answer.status_code == 401, answer.text
        await _untouched(s, database_url, sent["id"])

        assert (await s.api.post(path, content=json.dumps(v1))).json()["changed"] == 1
        found = (await s.api.get(f"/notifications/{sent['id']}")).json()
        assert found["delivery"] == {
            "state": "delivered",
            "at": "2026-12-07T10:00:00Z",
            "reason": None,
        }

        v2 = sns_message(key, complaint, version="2")
        assert (await s.api.post(path, content=json.dumps(v2))).json()["changed"] == 1
        found = (await s.api.get(f"/notifications/{sent['id']}")).json()
        assert found["delivery"]["state"] == "complained"
        assert found["delivery"]["reason"] == "abuse"
        # A later, weaker receipt (a delivery after the complaint) changes nothing.
        late = sns_message(key, delivery, version="2")
        assert (await s.api.post(path, content=json.dumps(late))).json()["changed"] == 0
        listed = (await s.api.get("/suppressions")).json()
        assert [(i["channel"], i["address"], i["reason"]) for i in listed["items"]] == [
            ("email", "bob@example.com", "complained")
        ]
        assert listed["items"][0]["notificationId"] == sent["id"]

        # A subscription confirmation is verified, logged, and never fetched.
        confirmation = sns_message(key, {}, version="2")
        confirmation.update(
            Type="SubscriptionConfirmation",
            Message="You have chosen to subscribe",
            SubscribeURL="http://127.0.0.1:9/never-fetched",
            Token="t0k3n",
        )
        confirmation.pop("Subject")
        answer = await s.api.post(path, content=json.dumps(sns_sign(key, confirmation)))
        assert answer.json() == {"received": 0, "matched": 0, "changed": 0}
        assert "never-fetched" in (tmp_path / "api.log").read_text()


async def test_standard_webhooks_receipts_refuse_replays_bad_bodies_and_oversized_requests(
    database_url: str, tmp_path: Path
) -> None:
    async with stack(database_url, tmp_path, "--max-body-bytes", "2048") as s:
        sent = await s.sent(channel="push", recipient="device-token-1", body="ping")
        assert sent["provider"] == "hooks"
        path = "/providers/hooks/events"
        body = json.dumps(
            {
                "providerMessageId": sent["providerMessageId"],
                "event": "bounced",
                "permanent": False,
                "reason": "device offline",
            }
        ).encode()

        replayed = await s.api.post(
            path, content=body, headers=standard_webhooks(body, at=int(time.time()) - 400)
        )
        wrong_secret = await s.api.post(
            path,
            content=body,
            headers=standard_webhooks(body, secret="whsec_" + "QUJDREVGR0hJSktMTU5PUA=="),
        )
        tampered = await s.api.post(
            path, content=body.replace(b"false", b"true"), headers=standard_webhooks(body)
        )
        for refused in (replayed, wrong_secret, tampered):
            assert refused.status_code == 401, refused.text
        big = json.dumps({"providerMessageId": "x", "event": "delivered", "reason": "x" * 4000})
        oversized = await s.api.post(path, content=big, headers=standard_webhooks(big.encode()))
        assert oversized.status_code == 413
        await _untouched(s, database_url, sent["id"])

        nonsense = json.dumps({"providerMessageId": "x", "event": "exploded"}).encode()
        answer = await s.api.post(path, content=nonsense, headers=standard_webhooks(nonsense))
        assert answer.status_code == 400

        accepted = await s.api.post(path, content=body, headers=standard_webhooks(body))
        assert accepted.json() == {"received": 1, "matched": 1, "changed": 1}
        found = (await s.api.get(f"/notifications/{sent['id']}")).json()
        assert found["delivery"]["state"] == "bounced"
        # A temporary bounce suppresses nothing.
        assert (await s.api.get("/suppressions")).json() == {"items": [], "nextCursor": None}


async def test_receipts_sent_at_the_same_moment_are_each_answered_for_their_own_events(
    database_url: str, tmp_path: Path
) -> None:
    async with stack(database_url, tmp_path) as s:
        created = [
            (
                await s.api.post(
                    "/notifications",
                    json={"channel": "push", "recipient": f"device-{i}", "body": "x"},
                    headers={"Idempotency-Key": f"together-{i}"},
                )
            ).json()["id"]
            for i in range(12)
        ]
        sent = [await s.final(id_) for id_ in created]
        path = "/providers/hooks/events"

        async def receipt(message_id: str) -> dict[str, Any]:
            body = json.dumps({"providerMessageId": message_id, "event": "delivered"}).encode()
            answer = await s.api.post(path, content=body, headers=standard_webhooks(body))
            assert answer.status_code == 200, answer.text
            result: dict[str, Any] = answer.json()
            return result

        known = [n["providerMessageId"] for n in sent]
        answers = await asyncio.gather(
            *(receipt(m) for m in known), *(receipt(f"unknown-{i}") for i in range(12))
        )

        assert answers[:12] == [{"received": 1, "matched": 1, "changed": 1}] * 12
        assert answers[12:] == [{"received": 1, "matched": 0, "changed": 0}] * 12
        assert await sql(database_url, "SELECT count(*) FROM nq_delivery_receipts") == [(12,)]
