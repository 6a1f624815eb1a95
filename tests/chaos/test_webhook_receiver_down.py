"""The webhook receiver goes away: for a while (connections refused, then back on the same port),
or for good (it answers 503 to everything).

While it is away the events wait in the outbox and are retried with backoff; once it is back every
event arrives with its original eventId, a valid Standard Webhooks signature and the payload stored
with the status change. A receiver that never recovers leaves its events `failed` after
--webhook-max-attempts, counted in the API's /metrics
(`notify_queue_webhook_events{state="failed"}`), and the notifications exactly as they were.
"""

from __future__ import annotations

import aiohttp

from notify_queue.repositories.db import Database
from tests.chaos.harness import (
    all_final,
    audit,
    enqueue,
    new_notifications,
    poll,
    read_rows,
    record,
    worker_flags,
)
from tests.chaos.peers import SignedWebhookReceiver
from tests.support import free_port

NOTIFICATIONS = 300


async def _event_states(db: Database) -> dict[str, int]:
    rows = await read_rows(
        db,
        "SELECT state, count(*) AS n, min(attempts) AS least FROM nq_webhook_events GROUP BY state",
    )
    return {r["state"]: int(r["n"]) for r in rows} | {
        f"least_attempts_{r['state']}": int(r["least"]) for r in rows
    }


async def test_events_wait_while_the_receiver_is_down_and_arrive_with_their_original_ids(
    db: Database, database_url: str, receiver: SignedWebhookReceiver, spawn
) -> None:
    await receiver.go_down()
    workers = spawn(database_url, *worker_flags(None, receiver, webhook_max_attempts=40))
    workers.start()
    workers.start()
    ids = await enqueue(db, new_notifications(NOTIFICATIONS, tag="hookdown"))
    await poll(lambda: all_final(db, NOTIFICATIONS), timeout=30, what="all sent")

    async def retried_while_down() -> bool:
        states = await _event_states(db)
        return (
            states.get("pending") == NOTIFICATIONS and states.get("least_attempts_pending", 0) >= 3
        )

    await poll(
        retried_while_down, timeout=30, what="every event retried while the receiver is down"
    )
    assert receiver.posts == 0
    await receiver.come_back()
    await poll(
        lambda: _async_eq(_event_states(db), "delivered", NOTIFICATIONS),
        timeout=30,
        what="every event delivered after the receiver came back",
    )
    result = await audit(db, ids, None, receiver)
    attempts = await read_rows(
        db, "SELECT min(attempts) AS least, max(attempts) AS most FROM nq_webhook_events"
    )
    result.extra |= {"attempts_min": attempts[0]["least"], "attempts_max": attempts[0]["most"]}
    record("webhook receiver down, then back", result)
    assert result.problems == []
    assert result.webhook_events == NOTIFICATIONS and result.webhooks_received == NOTIFICATIONS
    assert set(receiver.events) == {
        str(e["id"]) for e in await read_rows(db, "SELECT id FROM nq_webhook_events")
    }


async def test_a_receiver_that_never_recovers_leaves_events_failed_and_notifications_untouched(
    db: Database, database_url: str, receiver: SignedWebhookReceiver, spawn
) -> None:
    receiver.answer_status = 503
    port = free_port()
    procs = spawn(
        database_url,
        *worker_flags(
            None,
            receiver,
            webhook_max_attempts=3,
            # Every attempt must reach the receiver for the count of posts below to be exact: a
            # post that times out is an attempt the receiver (this test's busy event loop) may
            # never have read, which a loaded host showed with the usual 1 s (555 posts of 600).
            webhook_timeout=10,
            webhook_backoff_base=0.05,
            webhook_backoff_max=0.1,
        ),
    )
    procs.start()
    procs.start()
    procs.start_api(port)
    ids = await enqueue(db, new_notifications(200, tag="hookdead"))
    await poll(lambda: all_final(db, 200), timeout=30, what="all sent")
    await poll(
        lambda: _async_eq(_event_states(db), "failed", 200), timeout=30, what="every event failed"
    )

    rows = await read_rows(
        db,
        "SELECT n.status, n.attempt_count, n.updated_at, e.created_at AS event_at, e.attempts"
        " FROM nq_all_notifications n JOIN nq_webhook_events e ON e.notification_id = n.id",
    )
    async with aiohttp.ClientSession() as http:
        base = f"http://127.0.0.1:{port}"
        await poll(lambda: _get_ok(http, f"{base}/readyz"), timeout=30, what="API ready")
        async with http.get(f"{base}/status") as r:
            status = await r.json()
        async with http.get(f"{base}/metrics") as r:
            metrics = await r.text()
    record(
        "webhook receiver never recovers",
        {
            "notifications": len(ids),
            "webhook_events": len(rows),
            "posts_refused": receiver.posts,
            "metrics_webhook_failed": [m for m in metrics.splitlines() if 'state="failed"' in m],
            "statuses": {k: v for k, v in status["counts"].items() if v},
        },
    )
    assert len(rows) == 200
    assert all(r["status"] == "SENT" and r["attempt_count"] == 1 for r in rows)
    # The status change and its event are one statement, so they share a timestamp; nothing
    # touched the notification after it (a failing webhook never changes the notification).
    assert all(r["updated_at"] == r["event_at"] for r in rows)
    assert all(r["attempts"] == 3 for r in rows) and receiver.posts == 600
    assert status["counts"]["SENT"] == 200
    assert 'notify_queue_webhook_events{state="failed"} 200.0' in metrics


async def _async_eq(states_coro, key: str, value: int) -> bool:  # type: ignore[no-untyped-def]
    return (await states_coro).get(key) == value


async def _get_ok(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url) as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False
