"""Delivery receipts on the real Citus cluster (docs/receipts.md, docs/scaling.md): a permanent
SendGrid bounce recorded through the API shows in the notification's `delivery` and its webhook
event, and suppresses the next send to the address without a provider call. The receipts and
the suppression list are reference tables there (citus/layout.sql).

Real parts: the cluster of tests/citus/cluster.py, `notify-queue migrate|api|worker` as
processes, the receipts stack's HTTP provider and webhook receiver (tests/receipts/stack.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.citus.test_layout import migrate
from tests.receipts.stack import sendgrid, stack
from tests.support import eventually

pytestmark = pytest.mark.citus


async def test_a_bounce_on_citus_shows_in_delivery_and_suppresses_the_next_send(
    citus_database: str, tmp_path: Path
) -> None:
    migrate(citus_database)
    async with stack(citus_database, tmp_path) as s:
        first = await s.sent(channel="email", recipient="gone@example.com", body="1")
        assert first["status"] == "SENT" and first["delivery"] is None
        body = json.dumps(
            [
                {
                    "email": first["recipient"],
                    "timestamp": int(time.time()),
                    "event": "bounce",
                    "type": "bounce",
                    "reason": "550 5.1.1 user unknown",
                    "sg_message_id": f"{first['providerMessageId']}.filter0001",
                }
            ]
        ).encode()
        answer = await s.api.post(
            "/providers/sg/events", content=body, headers=sendgrid(s.vendor.sendgrid_key, body)
        )
        assert answer.status_code == 200 and answer.json()["changed"] == 1, answer.text

        found = (await s.api.get(f"/notifications/{first['id']}")).json()
        assert found["delivery"]["state"] == "bounced"
        assert "user unknown" in found["delivery"]["reason"]

        async def delivered() -> list[dict[str, Any]] | None:
            return await s.delivery_events(first["id"]) or None

        events = await eventually(delivered, timeout=60)
        assert [e["delivery"]["state"] for e in events] == ["bounced"]

        # The next one to the address: suppressed, the provider not called again.
        second = await s.api.post(
            "/notifications",
            json={"channel": "email", "recipient": "gone@example.com", "body": "2"},
            headers={"Idempotency-Key": "second"},
        )
        assert second.status_code == 201, second.text
        assert second.json()["status"] == "SUPPRESSED"
        assert second.json()["lastError"] == "suppressed: bounced"
        other = await s.sent(channel="email", recipient="here@example.com", body="3")
        assert other["status"] == "SENT"
        assert [c["recipient"] for c in s.provider.calls] == [
            "gone@example.com",
            "here@example.com",
        ]
