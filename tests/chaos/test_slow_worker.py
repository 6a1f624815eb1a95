"""A slow worker whose lease expired reports late: its result is rejected, the newer one stands.

The provider stalls the first call for one key well past the lease and then answers 400 (a
permanent failure). Meanwhile the lease runs out, housekeeping puts the notification back, and a
second attempt (same idempotency key, new claim token) is delivered. When the stalled call
finally answers, the late FAILED result must be dropped: the notification stays SENT with the
second attempt's messageId and one webhook event, never a FAILED one.
"""

from __future__ import annotations

import asyncio

from notify_queue.repositories.db import Database
from tests.chaos.harness import (
    audit,
    enqueue,
    new_notifications,
    poll,
    read_rows,
    record,
    worker_flags,
)
from tests.chaos.peers import ChaosProvider, SignedWebhookReceiver, Stall

LEASE_SECONDS = 1.5
# The stalled call must answer after the lease ran out and the notification was taken again:
# 8.5 s of room for that, so that a busy machine's slow housekeeping cannot let the late answer
# meet its own, still unclaimed, token.
STALL_SECONDS = 10.0


async def test_a_late_result_from_a_worker_whose_lease_expired_is_rejected_and_the_newer_one_stands(
    db: Database, database_url: str, provider: ChaosProvider, receiver: SignedWebhookReceiver, spawn
) -> None:
    workers = spawn(
        database_url,
        *worker_flags(provider, receiver, lease_seconds=LEASE_SECONDS, provider_timeout=30),
    )
    workers.start()
    workers.start()
    await workers.ready()
    batch = new_notifications(20, tag="slow")
    slow_key = str(batch[0].id)
    provider.stalls[slow_key] = Stall(seconds=STALL_SECONDS, status=400)
    ids = await enqueue(db, batch)

    await poll(lambda: _sent(db, batch[0].id), timeout=20, what="the second attempt SENT")
    await poll(
        lambda: _async(any(k == slow_key for k, _ in provider.stall_answers)),
        timeout=STALL_SECONDS + 10,
        what="the stalled call answered",
    )
    await poll(
        lambda: _async("arrived after their claim expired; dropped" in workers.all_logs()),
        timeout=10,
        what="the late result dropped",
    )

    row = (
        await read_rows(
            db,
            "SELECT status, attempt_count, provider_message_id FROM nq_all_notifications"
            " WHERE id = %(id)s",
            {"id": batch[0].id},
        )
    )[0]
    events = await read_rows(
        db,
        "SELECT payload FROM nq_webhook_events WHERE notification_id = %(id)s",
        {"id": batch[0].id},
    )
    await poll(lambda: _all_delivered(db), timeout=20, what="webhooks delivered")
    result = await audit(db, ids, provider, receiver)
    result.extra |= {
        "slow_key_calls": provider.calls[slow_key],
        "slow_key_attempts": row["attempt_count"],
    }
    record("slow worker reports late", result)

    assert row["status"] == "SENT"
    assert row["provider_message_id"] == provider.message_ids[slow_key]
    assert row["attempt_count"] == 2 and provider.calls[slow_key] == 2
    assert provider.deliveries[slow_key] == 1
    assert len(events) == 1 and '"SENT"' in events[0]["payload"]
    assert result.problems == []


async def _sent(db: Database, id: object) -> bool:
    rows = await read_rows(
        db, "SELECT status FROM nq_all_notifications WHERE id = %(id)s", {"id": id}
    )
    return rows[0]["status"] == "SENT"


async def _all_delivered(db: Database) -> bool:
    rows = await read_rows(
        db, "SELECT count(*) AS n FROM nq_webhook_events WHERE state <> 'delivered'"
    )
    return rows[0]["n"] == 0


async def _async(value: bool) -> bool:
    await asyncio.sleep(0)
    return value
