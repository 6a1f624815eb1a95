"""The engine end to end on a real PostgreSQL: enqueue, claim, complete, webhook outbox."""

from __future__ import annotations

import json

from notify_queue.models import DeliveryResult, Outcome, Status
from notify_queue.repositories.db import Database
from tests.support import delivery_service, new, notification_service


async def test_a_due_notification_is_claimed_and_completed_as_sent(db: Database) -> None:
    notifications = notification_service(db)
    created = await notifications.enqueue(new())
    assert created.created and created.notification.status is Status.PENDING

    delivery = delivery_service(db, webhook_url="http://hooks.example/x")
    batch = await delivery.claim(10)
    assert [c.id for c in batch.claimed] == [created.notification.id]
    assert batch.claimed[0].attempt_count == 1

    _completions, recorded = await delivery.complete(
        [(batch.claimed[0], DeliveryResult(Outcome.SENT, provider_message_id="m-1"))]
    )
    assert recorded.accepted == {created.notification.id}
    stored = await notifications.get(created.notification.id)
    assert stored.status is Status.SENT and stored.provider_message_id == "m-1"
    events = await db.fetch_all("webhook_events_for_notification", {"notification_id": stored.id})
    assert len(events) == 1
    payload = json.loads(events[0]["payload"])
    assert payload["status"] == "SENT" and payload["jobId"] == str(stored.id)
    assert payload["eventId"] == str(events[0]["id"]) and payload["attemptCount"] == 1
