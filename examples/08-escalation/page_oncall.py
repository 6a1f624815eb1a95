"""Page the on-call engineer until somebody acknowledges (docs/escalation.md).

Push now, an SMS after 30 s, a phone call after 60 s; the script waits for the push to go out,
then acknowledges, which cancels the SMS and the call. In real use the acknowledgement comes
from the engineer (a link in the push, a chat command, `kubectl notify ack`).

    NOTIFY_QUEUE_URL=http://127.0.0.1:8080 python page_oncall.py
(`notify-queue up` serves the API there, with workers; add NOTIFY_QUEUE_TOKEN if it has one.)
"""

from __future__ import annotations

import os
import time
import uuid

from notify_queue.client import Client

with Client(os.environ.get("NOTIFY_QUEUE_URL", "http://127.0.0.1:8080"),
            os.environ.get("NOTIFY_QUEUE_TOKEN")) as api:  # fmt: skip
    api.put_recipient("oncall-ana", phone="+4915112345678", push_tokens=["ana-phone"])
    page = api.create(
        idempotency_key=f"db-1-down-{uuid.uuid4().hex[:8]}",
        recipient_id="oncall-ana",
        subject="db-1 is down",
        body="Primary database db-1 stopped answering at 03:12.",
        priority="HIGH",
        escalation={
            "steps": [
                {"channel": "push"},
                {"channel": "sms", "afterSeconds": 30},
                {"channel": "voice", "afterSeconds": 60},
            ]
        },
    )
    assert "escalation" in page
    escalation = page["escalation"]["id"]
    print(f"escalation {escalation} {page['escalation']['state']}")
    deadline = time.monotonic() + 30
    while api.get_escalation(escalation)["notifications"][0]["status"] != "SENT":
        if time.monotonic() > deadline:
            raise SystemExit("the push was not sent within 30 s: is a worker running?")
        time.sleep(0.2)
    print("push SENT")
    acked = api.acknowledge_escalation(escalation, by="ana")
    print(f"escalation {escalation} {acked['state']} by {acked['acknowledgedBy']}")
    for step in acked["notifications"]:
        print(f"  {step['channel']:<5} {step['status']} {step['lastError'] or ''}".rstrip())
