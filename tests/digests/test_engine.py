"""Digests in the engine (docs/digests.md), on a real PostgreSQL, driven as a worker drives it:
items join one open digest, the claim closes it and hands out one carrier, the carrier's result
ends every item, maxItems closes it at once, a create after the close opens a new digest, and a
cancel leaves an open digest (all cancelled: nothing is sent). The clock is the database's: a
window of a second passes for real, waited for by polling, never by a sleep."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from notify_queue.errors import Conflict
from notify_queue.models import (
    DeliveryResult,
    DigestSpec,
    NewNotification,
    Outcome,
    Status,
    WaitingReason,
)
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery_log import DeliveryLogRepository
from notify_queue.services.delivery import DeliveryService
from notify_queue.services.kube import request_from_spec
from notify_queue.services.retention import DeliveryLogKeeper
from tests.api.support import sql
from tests.support import delivery_service, eventually, new, notification_service


def item(
    recipient: str,
    key: str = "likes",
    *,
    window: int = 1,
    max_items: int = 100,
    subject: str | None = None,
    body: str = "x",
) -> NewNotification:
    return dataclasses.replace(
        new(recipient=recipient, body=body),
        subject=subject,
        digest=DigestSpec(key=key, window_seconds=window, max_items=max_items),
    )


async def claim_carriers(delivery: DeliveryService) -> list:  # type: ignore[type-arg]
    async def claimed() -> list:  # type: ignore[type-arg]
        return (await delivery.claim(100)).claimed

    return await eventually(claimed, timeout=30, what="a digest's carrier claimed")


async def test_items_of_one_digest_are_sent_as_one_message_and_end_together(
    db: Database,
) -> None:
    notifications = notification_service(db)
    delivery = delivery_service(db, webhook_url="http://hooks.example/x")
    ana = f"ana-{uuid.uuid4().hex[:6]}@example.com"
    first = await notifications.enqueue(item(ana, subject="Ana liked your post", body="Ana"))
    # One batch: both join in the same statement (the order within a batch is the ids').
    others = await notifications.enqueue_many(
        [item(ana, subject=f"{n} liked it", body=n) for n in ("Ben", "Cem")]
    )
    every = [first.notification, *(r.notification for r in others)]
    digest = every[0].digest
    assert digest is not None and digest.count == 1
    assert {n.digest.id for n in every if n.digest} == {digest.id}
    # count: the items so far when answered (a batch answers after all of it joined).
    assert [n.digest.count for n in every if n.digest] == [1, 3, 3]
    assert all(n.waiting and n.waiting.reason is WaitingReason.DIGEST_WINDOW for n in every)

    # Nothing is claimable while the window is open.
    assert (await delivery.claim(100)).claimed == []
    carriers = await claim_carriers(delivery)
    assert len(carriers) == 1
    carrier = carriers[0]
    assert carrier.id == first.notification.id and carrier.digest_id == digest.id
    assert carrier.subject == "Ana liked your post (+2 more)"
    lines = carrier.body.split("\n")
    assert lines[0] == "Ana" and sorted(lines[1:]) == ["Ben", "Cem"]
    assert carrier.metadata["digest"]["count"] == 3

    # A create after the close opens a new digest under the same key.
    later = await notifications.enqueue(item(ana, body="Dee"))
    assert later.notification.digest is not None
    assert later.notification.digest.id != digest.id and later.notification.digest.count == 1

    _, recorded = await delivery.complete(
        [(carrier, DeliveryResult(Outcome.SENT, provider_message_id="pm-1"))]
    )
    assert recorded.accepted == {carrier.id}
    for n in every:
        stored = await notifications.get(n.id)
        assert stored.status is Status.SENT and stored.provider_message_id == "pm-1"
        assert stored.digest is not None and stored.digest.id == digest.id
        events = await db.fetch_all("webhook_events_for_notification", {"notification_id": n.id})
        assert len(events) == 1
    assert (await notifications.get(later.notification.id)).status is Status.PENDING


async def test_max_items_closes_the_digest_at_once(db: Database) -> None:
    notifications = notification_service(db)
    delivery = delivery_service(db)
    bo = f"bo-{uuid.uuid4().hex[:6]}@example.com"
    # A window of a day: only maxItems can close it within the test.
    made = await notifications.enqueue_many(
        [item(bo, window=86_400, max_items=3, body=str(i)) for i in range(4)]
    )
    ids = [r.notification.digest.id for r in made if r.notification.digest]
    assert ids[0] == ids[1] == ids[2] != ids[3]
    carriers = await claim_carriers(delivery)
    assert [c.digest_id for c in carriers] == [ids[0]]
    assert sorted(carriers[0].body.split("\n")) == ["0", "1", "2"]


async def test_a_cancelled_item_leaves_its_digest_and_all_cancelled_sends_nothing(
    db: Database,
) -> None:
    notifications = notification_service(db)
    delivery = delivery_service(db)
    cy = f"cy-{uuid.uuid4().hex[:6]}@example.com"
    dee = f"dee-{uuid.uuid4().hex[:6]}@example.com"
    a = await notifications.enqueue(item(cy, body="a"))
    b = await notifications.enqueue(item(cy, body="b"))
    c = await notifications.enqueue(item(cy, body="c"))
    lonely = await notifications.enqueue(item(dee, body="only"))
    # The carrier (the first) leaves: the oldest left carries the digest.
    assert (await notifications.cancel(a.notification.id)).status is Status.CANCELLED
    assert (await notifications.get(b.notification.id)).digest.count == 2  # type: ignore[union-attr]
    assert (await notifications.cancel(lonely.notification.id)).status is Status.CANCELLED
    carriers = await claim_carriers(delivery)
    assert [x.id for x in carriers] == [b.notification.id]
    assert carriers[0].body == "b\nc"
    # Once closed, its items are being sent: a cancel is refused (409 from the API).
    with pytest.raises(Conflict):
        await notifications.cancel(c.notification.id)


def test_a_notification_objects_digest_names_a_template_of_its_namespace() -> None:
    spec = {
        "channel": "email",
        "recipient": "a@example.com",
        "body": "x",
        "digest": {"key": "likes", "windowSeconds": 60, "template": "likes"},
    }
    data = request_from_spec("team-a", spec)
    assert data["digest"]["key"] == "likes" and data["digest"]["template"] != "likes"
    assert spec["digest"]["template"] == "likes"  # the object's own spec is not changed


async def test_retention_removes_digests_closed_before_it_and_keeps_the_rest(
    db: Database, database_url: str
) -> None:
    notifications = notification_service(db)
    old = await notifications.enqueue(item(f"old-{uuid.uuid4().hex[:6]}@example.com"))
    kept = await notifications.enqueue(item(f"new-{uuid.uuid4().hex[:6]}@example.com"))
    assert old.notification.digest is not None and kept.notification.digest is not None
    await notifications.cancel(old.notification.id)  # its last item: the digest is cancelled
    await sql(
        database_url,
        "UPDATE nq_digests SET closed_at = now() - interval '40 days' WHERE id = %s",
        [old.notification.digest.id],
    )
    keeper = DeliveryLogKeeper(DeliveryLogRepository(db), retention_days=30)
    await keeper.maintain()
    assert (await notifications.get(old.notification.id)).digest is None
    assert (await notifications.get(kept.notification.id)).digest is not None
