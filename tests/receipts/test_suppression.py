"""The suppression list through real processes (docs/receipts.md): a permanent SendGrid bounce
puts the address on the list; a later notification to it (any case) ends SUPPRESSED with
`lastError` `suppressed: bounced`, at creation and at send time, and the provider is never
called for it (its calls are counted at the receiver); the list pages and an address deleted
from it is sent to again."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.receipts.stack import Stack, sendgrid, stack
from tests.support import eventually


async def _bounce(s: Stack, sent: dict[str, Any], kind: str = "bounce") -> None:
    body = json.dumps(
        [
            {
                "email": sent["recipient"],
                "timestamp": int(time.time()),
                "event": kind,
                "type": "bounce",
                "reason": "550 5.1.1 user unknown",
                "sg_message_id": f"{sent['providerMessageId']}.filter0001",
            }
        ]
    ).encode()
    answer = await s.api.post(
        "/providers/sg/events", content=body, headers=sendgrid(s.vendor.sendgrid_key, body)
    )
    assert answer.json()["changed"] == 1, answer.text


async def test_a_permanent_bounce_suppresses_later_sends_without_a_provider_call(
    database_url: str, tmp_path: Path
) -> None:
    async with stack(database_url, tmp_path) as s:
        first = await s.sent(channel="email", recipient="gone@example.com", body="1")
        # Queued before the bounce, due after it: stopped at send time.
        later = await s.api.post(
            "/notifications",
            json={
                "channel": "email",
                "recipient": "gone@example.com",
                "body": "2",
                "delaySeconds": 8,
            },
            headers={"Idempotency-Key": "later"},
        )
        assert later.json()["status"] == "PENDING"
        await _bounce(s, first)
        calls = len(s.provider.calls)
        assert calls == 1

        # Created after the bounce: born SUPPRESSED, whatever the address's case.
        born = await s.api.post(
            "/notifications",
            json={"channel": "email", "recipient": "Gone@Example.com", "body": "3"},
            headers={"Idempotency-Key": "born"},
        )
        assert born.status_code == 201
        assert born.json()["status"] == "SUPPRESSED"
        assert born.json()["lastError"] == "suppressed: bounced"

        stopped = await s.final(later.json()["id"])
        assert stopped["status"] == "SUPPRESSED"
        assert stopped["lastError"] == "suppressed: bounced"
        assert stopped["attemptCount"] == 0
        # Another address is still sent to, after both: so the worker has had every chance.
        other = await s.sent(channel="email", recipient="here@example.com", body="4")
        assert other["status"] == "SENT"
        assert [c["recipient"] for c in s.provider.calls] == [
            "gone@example.com",
            "here@example.com",
        ]

        listed = (await s.api.get("/suppressions", params={"address": "GONE@example.com"})).json()
        assert [(i["channel"], i["address"], i["reason"]) for i in listed["items"]] == [
            ("email", "gone@example.com", "bounced")
        ]
        assert listed["items"][0]["notificationId"] == first["id"]
        metrics = (await s.api.get("/metrics")).text
        assert 'notify_queue_suppressions{channel="email"} 1.0' in metrics

        removed = await s.api.delete("/suppressions/email/Gone@Example.com")
        assert removed.status_code == 204
        assert (await s.api.delete("/suppressions/email/gone@example.com")).status_code == 404
        again = await s.sent(channel="email", recipient="gone@example.com", body="5")
        assert again["status"] == "SENT"
        assert len(s.provider.calls) == 3


async def test_the_suppression_list_pages_with_a_cursor_and_temporary_bounces_stay_off_it(
    database_url: str, tmp_path: Path
) -> None:
    async with stack(database_url, tmp_path) as s:
        sent = [
            await s.sent(channel="email", recipient=f"r{i}@example.com", body="x") for i in range(3)
        ]
        for one in sent:
            await _bounce(s, one, kind="spamreport")
        blocked = await s.sent(channel="email", recipient="busy@example.com", body="x")
        body = json.dumps(
            [
                {
                    "event": "bounce",
                    "type": "blocked",
                    "timestamp": int(time.time()),
                    "sg_message_id": blocked["providerMessageId"],
                }
            ]
        ).encode()
        await s.api.post(
            "/providers/sg/events", content=body, headers=sendgrid(s.vendor.sendgrid_key, body)
        )

        first = (await s.api.get("/suppressions", params={"limit": 2})).json()
        assert [i["address"] for i in first["items"]] == ["r0@example.com", "r1@example.com"]
        assert {i["reason"] for i in first["items"]} == {"complained"}
        rest = (
            await s.api.get("/suppressions", params={"limit": 2, "cursor": first["nextCursor"]})
        ).json()
        assert [i["address"] for i in rest["items"]] == ["r2@example.com"]
        assert rest["nextCursor"] is None
        assert (await s.api.get("/suppressions", params={"cursor": "bm9wZQ"})).status_code == 400

        async def delivered_state() -> Any:
            return (await s.api.get(f"/notifications/{blocked['id']}")).json()["delivery"]

        assert (await eventually(delivered_state))["state"] == "bounced"
