"""Webhooks through the transactional outbox: same transaction as the status, retried with the
same eventId, signed per Standard Webhooks (with a secret only for the URL it was configured
for), and never able to change the notification."""

from __future__ import annotations

import base64

import psycopg
import pytest
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from notify_queue.models import DeliveryResult, Outcome, Policy, Status
from notify_queue.providers.simulated import SimulatedProvider
from notify_queue.repositories.db import Database
from notify_queue.repositories.policies import PolicyRepository
from notify_queue.repositories.webhooks import WebhookRepository
from notify_queue.services.webhooks import decide_webhook_result
from tests.receivers import Received, WebhookReceiver
from tests.support import delivery_service, eventually, new, notification_service, start_workers
from tests.test_posting import NO_CONTENT, RawServer, webhook_id_of

SECRET = "whsec_" + base64.b64encode(b"a-test-secret-of-32-bytes-length").decode()


async def _events(db: Database, id: object) -> list[dict[str, object]]:
    return await db.fetch_all("webhook_events_for_notification", {"notification_id": id})


async def test_the_webhook_event_is_written_in_the_same_transaction_as_the_status(
    db: Database,
) -> None:
    """A failure after the status change rolls both back: there is never one without the other."""
    created = await notification_service(db).enqueue(new(webhook_url="http://hooks.example/a"))
    service = delivery_service(db)
    claimed = (await service.claim(1)).claimed[0]
    # Make the event insert fail inside the completion statement.
    async with db.connection() as conn:
        await conn.execute_script(
            "ALTER TABLE nq_webhook_events ADD CONSTRAINT no_events CHECK (false) NOT VALID"
        )
    with pytest.raises(psycopg.errors.CheckViolation):
        await service.complete([(claimed, DeliveryResult(Outcome.SENT))])
    stored = await notification_service(db).get(created.notification.id)
    assert stored.status is Status.PROCESSING and await _events(db, stored.id) == []


async def test_an_event_written_before_a_crash_is_still_delivered_later(
    db: Database, database_url: str
) -> None:
    receiver = await WebhookReceiver().start()
    try:
        created = await notification_service(db).enqueue(new(webhook_url=receiver.url))
        service = delivery_service(db)
        claimed = (await service.claim(1)).claimed[0]
        await service.complete([(claimed, DeliveryResult(Outcome.SENT))])
        # The worker "crashed" here: status and event are committed, nothing was sent.
        assert receiver.received == []
        workers = await start_workers(database_url, SimulatedProvider(0, 0, 1), webhooks=True)
        try:
            await eventually(lambda: _delivered(db, created.notification.id))
        finally:
            await workers.stop()
        assert len(receiver.received) == 1
        body = receiver.received[0].json
        assert body["jobId"] == str(created.notification.id) and body["status"] == "SENT"
        assert receiver.received[0].headers["webhook-id"] == body["eventId"]
    finally:
        await receiver.stop()


async def _delivered(db: Database, id: object) -> bool:
    return any(e["state"] == "delivered" for e in await _events(db, id))


async def test_a_failing_webhook_is_retried_with_the_same_event_id_and_a_valid_signature(
    db: Database, database_url: str
) -> None:
    receiver = await WebhookReceiver(fail_first=2).start()
    try:
        created = await notification_service(db).enqueue(new(webhook_url=receiver.url))
        workers = await start_workers(
            database_url,
            SimulatedProvider(0, 0, 1),
            webhooks=True,
            webhook_url=receiver.url,  # the URL --webhook-secret is configured for
            webhook_secret=SECRET,
            webhook_backoff_base=0.05,
            webhook_backoff_max=0.1,
        )
        try:
            await eventually(lambda: _delivered(db, created.notification.id), timeout=15)
        finally:
            await workers.stop()
        assert len(receiver.received) == 3
        ids = {r.headers["webhook-id"] for r in receiver.received}
        assert len(ids) == 1
        for r in receiver.received:
            Webhook(SECRET).verify(r.body, r.headers)
        stored = await notification_service(db).get(created.notification.id)
        assert stored.status is Status.SENT
    finally:
        await receiver.stop()


async def test_a_webhook_that_never_recovers_ends_failed_and_leaves_the_notification_alone(
    db: Database, database_url: str
) -> None:
    receiver = await WebhookReceiver(always_fail=True).start()
    try:
        created = await notification_service(db).enqueue(new(webhook_url=receiver.url))
        workers = await start_workers(
            database_url,
            SimulatedProvider(0, 0, 1),
            webhooks=True,
            webhook_max_attempts=3,
            webhook_backoff_base=0.02,
            webhook_backoff_max=0.05,
        )
        try:
            await eventually(
                lambda: _event_state(db, created.notification.id, "failed"), timeout=15
            )
        finally:
            await workers.stop()
        assert len(receiver.received) == 3
        stored = await notification_service(db).get(created.notification.id)
        assert stored.status is Status.SENT
        status = await notification_service(db).status()
        assert status.webhook_events["failed"] == 1
    finally:
        await receiver.stop()


async def _event_state(db: Database, id: object, state: str) -> bool:
    return any(e["state"] == state for e in await _events(db, id))


async def test_no_webhook_url_anywhere_means_no_event(db: Database) -> None:
    """Nor a wake-up of the relay: the completion says no event can have been written."""
    created = await notification_service(db).enqueue(new())
    service = delivery_service(db)
    claimed = (await service.claim(1)).claimed[0]
    _, recorded = await service.complete([(claimed, DeliveryResult(Outcome.SENT))])
    assert await _events(db, created.notification.id) == []
    assert recorded.accepted == {claimed.id} and not recorded.events_possible


async def test_a_completion_says_when_it_may_have_written_events(db: Database) -> None:
    """The worker wakes its relay on this answer: a row's own URL, or the worker's default URL,
    says yes for a final result; a retry (no event) says no."""
    own = await notification_service(db).enqueue(new(webhook_url="http://hooks.example/a"))
    plain = await notification_service(db).enqueue(new())
    service = delivery_service(db)
    claimed = {c.id: c for c in (await service.claim(2)).claimed}
    _, retried = await service.complete(
        [(claimed[own.notification.id], DeliveryResult(Outcome.TEMPORARY_FAILURE, error="busy"))]
    )
    assert not retried.events_possible and await _events(db, own.notification.id) == []
    _, sent = await delivery_service(db, webhook_url="http://default.example/hook").complete(
        [(claimed[plain.notification.id], DeliveryResult(Outcome.SENT))]
    )
    assert sent.events_possible and len(await _events(db, plain.notification.id)) == 1


async def test_the_default_webhook_url_is_used_when_the_notification_has_none(db: Database) -> None:
    created = await notification_service(db).enqueue(new())
    service = delivery_service(db, webhook_url="http://default.example/hook")
    claimed = (await service.claim(1)).claimed[0]
    await service.complete([(claimed, DeliveryResult(Outcome.PERMANENT_FAILURE, error="nope"))])
    events = await _events(db, created.notification.id)
    assert [e["url"] for e in events] == ["http://default.example/hook"]
    assert '"FAILED"' in str(events[0]["payload"])


async def test_the_attempt_counts_at_the_claim_and_a_lost_last_attempt_ends_failed(
    db: Database,
) -> None:
    """Nothing is ever recorded for this event (its POSTs all crash, or their processes die): each
    claim still uses an attempt, and once the last attempt's lease has run out the event ends
    failed instead of being claimed (POSTed) again. 0.1.0's claim went on for ever: 1, 2, 3, 4."""
    created = await notification_service(db).enqueue(new(webhook_url="http://hooks.example/a"))
    service = delivery_service(db)
    claimed = (await service.claim(1)).claimed[0]
    await service.complete([(claimed, DeliveryResult(Outcome.SENT))])
    repository = WebhookRepository(db)
    claims = []
    for _ in range(4):
        events = await repository.webhook_events_claim(
            limit=10, lease_seconds=0, max_attempts=2, default_url=None, default_secrets=()
        )
        claims.append([e.attempts for e in events])
    assert claims == [[1], [2], [], []]
    [event] = await _events(db, created.notification.id)
    assert event["state"] == "failed" and event["attempts"] == 2
    assert "attempt 2: no result recorded before its lease expired" in str(event["last_error"])


async def test_a_result_recorded_under_the_claim_is_not_counted_again(db: Database) -> None:
    """Recording never adds an attempt (0.1.0 relays record with the same statement, beside
    these during an upgrade): each claim counts one, the third is the last, and its recorded
    result, not the lease, is why the event failed."""
    created = await notification_service(db).enqueue(new(webhook_url="http://hooks.example/a"))
    service = delivery_service(db)
    claimed = (await service.claim(1)).claimed[0]
    await service.complete([(claimed, DeliveryResult(Outcome.SENT))])
    repository = WebhookRepository(db)
    seen = []
    for _ in range(4):
        events = await repository.webhook_events_claim(
            limit=10, lease_seconds=60, max_attempts=3, default_url=None, default_secrets=()
        )
        seen += [e.attempts for e in events]
        results = [
            decide_webhook_result(
                e, "HTTP 500", max_attempts=3, backoff_base_seconds=0, backoff_max_seconds=0
            )
            for e in events
        ]
        await repository.webhook_results_record(results=results)
    assert seen == [1, 2, 3]
    [event] = await _events(db, created.notification.id)
    assert event["state"] == "failed" and event["attempts"] == 3
    assert event["last_error"] == "HTTP 500"


# --- which secret signs which URL (docs/security.md) ------------------------------------------

OTHER_SECRET = "whsec_" + base64.b64encode(b"a-policy-owners-secret-32-bytes!").decode()


def _verifies(secret: str, received: Received) -> bool:
    try:
        Webhook(secret).verify(received.body, received.headers)
    except WebhookVerificationError:
        return False
    return True


async def test_an_event_for_a_clients_own_url_is_not_signed_with_the_policys_secret(
    db: Database, database_url: str
) -> None:
    """A client that names someone's policy and its own webhookUrl must not receive events signed
    with that policy's secret: it could replay them to the policy's real receiver. The policy's
    own URL still gets them signed."""
    owner = await WebhookReceiver().start()
    client = await WebhookReceiver().start()
    try:
        policy = Policy(name="shop/orders", webhook_url=owner.url, webhook_secrets=(OTHER_SECRET,))
        await PolicyRepository(db).policy_upsert(policy=policy)
        mine = await notification_service(db).enqueue(new(policy="shop/orders"))
        theirs = await notification_service(db).enqueue(
            new(policy="shop/orders", webhook_url=client.url)
        )
        workers = await start_workers(database_url, SimulatedProvider(0, 0, 1), webhooks=True)
        try:
            for created in (mine, theirs):
                await eventually(lambda c=created: _delivered(db, c.notification.id))
        finally:
            await workers.stop()
        [to_owner] = owner.received
        [to_client] = client.received
        assert to_owner.json["jobId"] == str(mine.notification.id)
        assert to_client.json["jobId"] == str(theirs.notification.id)
        assert _verifies(OTHER_SECRET, to_owner)
        assert "webhook-signature" not in to_client.headers
        assert not _verifies(OTHER_SECRET, to_client)
    finally:
        await owner.stop()
        await client.stop()


async def test_the_workers_secret_signs_only_events_for_the_workers_webhook_url(
    db: Database, database_url: str
) -> None:
    """`--webhook-secret` belongs to `--webhook-url`: an event for a client's webhookUrl goes out
    unsigned, one for the worker's URL signed."""
    operator = await WebhookReceiver().start()
    client = await WebhookReceiver().start()
    try:
        default = await notification_service(db).enqueue(new())
        own = await notification_service(db).enqueue(new(webhook_url=client.url))
        workers = await start_workers(
            database_url,
            SimulatedProvider(0, 0, 1),
            webhooks=True,
            webhook_url=operator.url,
            webhook_secret=SECRET,
        )
        try:
            for created in (default, own):
                await eventually(lambda c=created: _delivered(db, c.notification.id))
        finally:
            await workers.stop()
        [to_operator] = operator.received
        [to_client] = client.received
        assert to_operator.json["jobId"] == str(default.notification.id)
        assert _verifies(SECRET, to_operator)
        assert "webhook-signature" not in to_client.headers
        assert not _verifies(SECRET, to_client)
    finally:
        await operator.stop()
        await client.stop()


async def test_a_kept_connection_closed_after_the_request_costs_one_post_per_attempt(
    db: Database, database_url: str
) -> None:
    """The receiver answers each connection's first POST and closes it, unanswered, on the
    second. The second event's first POST goes out on the kept connection and gets no answer:
    that is its first attempt, failed; the retry is the second attempt, on a new connection.
    Never two POSTs in one attempt (docs/reliability.md)."""
    server = RawServer(lambda n, request: NO_CONTENT if n == 0 else None)
    await server.start()
    workers = await start_workers(
        database_url,
        SimulatedProvider(0, 0, 1),
        webhooks=True,
        webhook_backoff_base=0.05,
        webhook_backoff_max=0.1,
    )
    try:
        ids = []
        for _ in range(2):  # one after the other: the second finds the first's kept connection
            created = await notification_service(db).enqueue(new(webhook_url=server.url()))
            await eventually(lambda c=created: _delivered(db, c.notification.id))
            ids.append(created.notification.id)
    finally:
        await workers.stop()
        assert server.server is not None
        server.server.close()
    events = [(await _events(db, id))[0] for id in ids]
    assert [e["attempts"] for e in events] == [1, 2]
    posted = [webhook_id_of(request) for _, request in server.requests]
    assert [posted.count(str(e["id"])) for e in events] == [1, 2]
    assert [c for c, _ in server.requests] == [0, 0, 1]
