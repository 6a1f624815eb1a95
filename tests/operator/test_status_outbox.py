"""The status outbox in PostgreSQL (migration 0003), without Kubernetes: the trigger queues a change
only for rows linked to Notification objects and only when what a status shows changed, wakes the
writer once per transaction, and the writer's batch coalesces an object's changes, holds a lock
no second writer gets, and the TTL sweep finds what is due."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from contextlib import suppress

from notify_queue.models import DeliveryResult, NewNotification, Outcome, Policy, Source, Status
from notify_queue.repositories.db import Database
from notify_queue.repositories.kube import KubeRepository
from notify_queue.repositories.policies import PolicyRepository
from tests.support import delivery_service, eventually, new, notification_service


def _k8s(**fields: object) -> NewNotification:
    return dataclasses.replace(new(**fields), source=Source.KUBERNETES)  # type: ignore[arg-type]


async def _linked(db: Database, count: int = 1, **fields: object) -> list[uuid.UUID]:
    """Enqueue Kubernetes notifications, link each to an object, drop their first status."""
    repo = KubeRepository(db)
    ids = []
    for _ in range(count):
        stored = (await notification_service(db).enqueue(_k8s(**fields))).notification
        uid = str(uuid.uuid4())
        await repo.kube_link_save(
            uid=uid, namespace="ns", name=f"n-{uid[:8]}", notification_id=stored.id, generation=1
        )
        ids.append(stored.id)
    async with repo.status_outbox_batch(namespace=None, limit=1000) as batch:
        assert batch is not None
        await batch.delete([s for c in batch.changes for s in c.outbox_seqs])
    return ids


async def _queued(db: Database) -> int:
    queued, _ = await KubeRepository(db).status_outbox_lag(namespace=None)
    return queued


async def test_linking_an_object_queues_its_first_status(db: Database) -> None:
    repo = KubeRepository(db)
    stored = (await notification_service(db).enqueue(_k8s())).notification
    await repo.kube_link_save(
        uid="u-1", namespace="ns", name="welcome", notification_id=stored.id, generation=1
    )
    await repo.kube_link_save(
        uid="u-1", namespace="ns", name="welcome", notification_id=stored.id, generation=1
    )

    async with repo.status_outbox_batch(namespace="ns", limit=10) as batch:
        assert batch is not None
        [change] = batch.changes
    assert (change.uid, change.namespace, change.name, change.linked) == (
        "u-1",
        "ns",
        "welcome",
        True,
    )
    assert len(change.outbox_seqs) == 2  # saved twice (a restart): written once
    assert change.notification is not None and change.notification.status is Status.PENDING
    assert change.entered_statuses == frozenset()


async def test_changes_of_api_rows_and_unlinked_rows_queue_nothing(db: Database) -> None:
    await notification_service(db).enqueue(new())
    await notification_service(db).enqueue(_k8s())  # a Kubernetes row whose link is not saved yet
    delivery = delivery_service(db)
    batch = await delivery.claim(10)
    await delivery.complete([(c, DeliveryResult(Outcome.SENT)) for c in batch.claimed])
    assert len(batch.claimed) == 2
    assert await _queued(db) == 0


async def test_each_change_a_status_shows_is_queued_and_coalesced_per_object(db: Database) -> None:
    [notification_id] = await _linked(db)
    delivery = delivery_service(db)
    claimed = (await delivery.claim(10)).claimed
    await delivery.complete([(claimed[0], DeliveryResult(Outcome.TEMPORARY_FAILURE, error="busy"))])

    repo = KubeRepository(db)
    async with repo.status_outbox_batch(namespace=None, limit=10) as batch:
        assert batch is not None
        [change] = batch.changes
        # PENDING -> PROCESSING (claim), PROCESSING -> PENDING with an error (temporary failure).
        assert len(change.outbox_seqs) == 2
        assert change.entered_statuses == {Status.PROCESSING, Status.PENDING}
        assert change.notification is not None and change.notification.id == notification_id
        assert change.notification.last_error == "busy" and change.notification.attempt_count == 1
        await batch.delete(change.outbox_seqs)
    assert await _queued(db) == 0


async def test_a_second_writer_gets_no_batch_while_the_first_holds_one(db: Database) -> None:
    await _linked(db)
    await notification_service(db).enqueue(_k8s())
    repo = KubeRepository(db)
    async with repo.status_outbox_batch(namespace="ns", limit=10) as first:
        assert first is not None
        async with repo.status_outbox_batch(namespace="ns", limit=10) as second:
            assert second is None
        async with repo.status_outbox_batch(namespace="elsewhere", limit=10) as other_scope:
            assert other_scope is not None and other_scope.changes == []


async def test_one_transaction_changing_many_linked_rows_wakes_the_writer_once(
    db: Database,
) -> None:
    await _linked(db, 20)
    repo = KubeRepository(db)
    stop = asyncio.Event()
    wakeups: list[None] = []
    connected = asyncio.Event()

    async def listen() -> None:
        async for item in repo.status_outbox_wakeups(stop):
            wakeups.append(item)
            connected.set()

    listener = asyncio.create_task(listen())
    try:
        await asyncio.wait_for(connected.wait(), timeout=30)
        assert len(wakeups) == 1  # the catch-up after connecting
        claimed = (await delivery_service(db).claim(100)).claimed  # one transaction, 20 rows
        assert len(claimed) == 20
        await eventually(lambda: _at_least(wakeups, 2), timeout=5)
        # A second notification would arrive right behind the first; give it the chance.
        await asyncio.sleep(0.3)
        assert len(wakeups) == 2
        assert await _queued(db) == 20
    finally:
        stop.set()
        listener.cancel()
        with suppress(asyncio.CancelledError):
            await listener


async def _at_least(items: list[None], count: int) -> bool:
    return len(items) >= count


async def test_the_ttl_sweep_takes_finished_objects_whose_policy_ttl_ran_out(db: Database) -> None:
    await PolicyRepository(db).policy_upsert(
        policy=Policy(name="ns/short", ttl_seconds_after_finished=0)
    )
    await PolicyRepository(db).policy_upsert(
        policy=Policy(name="ns/long", ttl_seconds_after_finished=3600)
    )
    [short] = await _linked(db, policy="ns/short")
    await _linked(db, policy="ns/long")
    await _linked(db)  # no policy: kept
    repo = KubeRepository(db)
    assert await repo.kube_finished_next_due(namespace="ns") is None  # nothing finished yet

    delivery = delivery_service(db)
    batch = await delivery.claim(10)
    await delivery.complete([(c, DeliveryResult(Outcome.SENT)) for c in batch.claimed])

    due = await repo.kube_finished_take_due(namespace="ns", limit=10)
    assert [link.notification_id for link in due] == [short]
    assert await repo.kube_finished_take_due(namespace="ns", limit=10) == []  # asked already
    next_due = await repo.kube_finished_next_due(namespace="ns")
    assert next_due is not None and 3500 < next_due <= 3600
