"""The operator under churn and volume, on a real kube-apiserver with a real worker: restarted in
the middle of a stream of Notifications, and run as two replicas, it neither makes a second row
for any object nor misses one; and with hundreds of objects at once every one reaches Sent and a
newcomer created among them is accepted (the design target is 2,000 objects; CI checks 400; how
fast is measured, not asserted: docs/operator.md)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest

from notify_queue.repositories.db import Database
from tests.operator.conftest import StartOperator
from tests.operator.support import Kube, notification, phase, running_worker, settings_for
from tests.support import eventually

pytestmark = pytest.mark.kubernetes

# 400 in CI (about 20 s on 2 cores); NOTIFY_QUEUE_TEST_VOLUME=2000 checks the design target.
VOLUME = int(os.environ.get("NOTIFY_QUEUE_TEST_VOLUME", "400"))


async def _create_many(kube: Kube, namespace: str, prefix: str, count: int) -> list[str]:
    names = [f"{prefix}-{i:04d}" for i in range(count)]
    limit = asyncio.Semaphore(16)

    async def create(name: str) -> None:
        async with limit:
            await kube.create(notification(namespace, name))

    await asyncio.gather(*(create(n) for n in names))
    return names


async def _phases(kube: Kube, namespace: str) -> dict[str, str | None]:
    return {o["metadata"]["name"]: phase(o) for o in await kube.list("Notification", namespace)}


async def _rows(db: Database) -> list[dict[str, Any]]:
    return await db.fetch_all(
        "notification_list",
        {
            "status": None,
            "channel": None,
            "recipient": None,
            "recipient_id": None,
            "after_created_at": None,
            "after_id": None,
            "limit": 5000,
        },
    )


async def test_a_restart_mid_stream_and_a_second_replica_neither_duplicate_nor_miss_objects(
    kube: Kube, namespace: str, start_operator: StartOperator, db: Database, database_url: str
) -> None:
    first_wave = await _create_many(kube, namespace, "a", 150)
    operator = await start_operator()
    await eventually(lambda: _at_least_rows(db, 10), timeout=20)
    await operator.stop()  # mid-stream: some mirrored (maybe all), none sent yet
    mirrored_at_stop = len(await _rows(db))

    async with running_worker(settings_for(database_url, namespace), db):
        # While no operator runs: the mirrored rows are sent (their changes queue up in the
        # status outbox), and more objects are created.
        await eventually(lambda: _all_rows_sent(db, mirrored_at_stop), timeout=30)
        second_wave = await _create_many(kube, namespace, "b", 50)
        queued_while_down = (await db.fetch_one("status_outbox_lag", {"namespace": None}) or {})[
            "queued"
        ]
        # Two replicas at once from here on.
        await asyncio.gather(start_operator(), start_operator())

        async def all_sent() -> dict[str, str | None] | None:
            phases = await _phases(kube, namespace)
            return phases if set(phases.values()) == {"Sent"} else None

        phases = await eventually(all_sent, timeout=60, interval=0.5)

    print(
        f"at the restart: {mirrored_at_stop} of {len(first_wave)} mirrored, "
        f"{queued_while_down} status changes queued while no operator ran"
    )
    assert queued_while_down >= mirrored_at_stop  # caught up from the outbox, not lost
    assert sorted(phases) == sorted(first_wave + second_wave)
    rows = await _rows(db)
    objects = {o["metadata"]["uid"] for o in await kube.list("Notification", namespace)}
    assert len(rows) == len(objects) == 200
    assert {r["idempotency_key"] for r in rows} == {f"k8s:{uid}" for uid in objects}
    assert all(r["status"] == "SENT" and r["attempt_count"] == 1 for r in rows)
    await eventually(lambda: _outbox_empty(db), timeout=10)


async def _all_rows_sent(db: Database, count: int) -> bool:
    rows = await _rows(db)
    return len(rows) == count and all(r["status"] == "SENT" for r in rows)


async def _at_least_rows(db: Database, count: int) -> bool:
    return len(await _rows(db)) >= count


async def _outbox_empty(db: Database) -> bool:
    row = await db.fetch_one("status_outbox_lag", {"namespace": None})
    return row is not None and row["queued"] == 0


async def test_hundreds_of_notifications_all_reach_sent_and_a_newcomer_among_them_is_accepted(
    kube: Kube, namespace: str, start_operator: StartOperator, db: Database, database_url: str
) -> None:
    await start_operator(status_patches_per_second=200.0)
    started = time.monotonic()
    async with running_worker(settings_for(database_url, namespace), db):
        names = await _create_many(kube, namespace, "bulk", VOLUME)
        created = time.monotonic()
        # While the flood is being worked through, one more object is still accepted promptly.
        await kube.create(notification(namespace, "newcomer"))

        async def newcomer_accepted() -> bool:
            return phase(await kube.get("Notification", namespace, "newcomer")) in (
                "Pending",
                "Processing",
                "Sent",
            )

        # Deadlines, not speed claims: generous for a busy machine (two suites on 2 cores, where
        # the API server writes slowly). How soon is docs/operator.md's figure, printed below.
        await eventually(newcomer_accepted, timeout=120, interval=0.2, what="newcomer accepted")
        newcomer_latency = time.monotonic() - created

        async def all_sent() -> bool:
            phases = await _phases(kube, namespace)
            return sum(1 for p in phases.values() if p == "Sent") == len(names) + 1

        await eventually(all_sent, timeout=VOLUME * 0.75, interval=0.5, what="all Sent")
    elapsed = time.monotonic() - started
    print(
        f"{VOLUME} created in {created - started:.1f}s, newcomer accepted after "
        f"{newcomer_latency:.1f}s, all Sent after {elapsed:.1f}s"
    )
    assert len(await _rows(db)) == VOLUME + 1
