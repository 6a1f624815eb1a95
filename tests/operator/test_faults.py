"""Faults on the Kubernetes path, with a few hundred Notifications on a real kube-apiserver, etcd,
PostgreSQL and worker: the operator process killed (SIGKILL) while objects are being applied and
started again, which re-lists them all with no kopf bookkeeping in memory; the kube-apiserver
restarted mid-run, which breaks every watch (kopf re-watches, and re-lists on 410 Gone). After
each: one row per object (none made twice, none lost), every object's status says Sent, the
status outbox is empty. How long the catch-up took is printed, not asserted
(docs/operator.md "Faults"; the 10,000-object run is `make bench-k8s-faults`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from notify_queue.devcluster import LocalControlPlane
from notify_queue.repositories.db import Database
from tests.api.support import sql
from tests.operator.conftest import StartOperator
from tests.operator.support import Kube, notification, phase, running_worker, settings_for
from tests.support import eventually

pytestmark = pytest.mark.kubernetes

COUNT = int(os.environ.get("NOTIFY_QUEUE_TEST_FAULT_OBJECTS", "200"))


async def _create(kube: Kube, namespace: str, names: list[str]) -> None:
    limit = asyncio.Semaphore(16)

    async def create(name: str) -> None:
        async with limit:
            await kube.create(notification(namespace, name))

    await asyncio.gather(*(create(n) for n in names))


async def _all_sent(kube: Kube, namespace: str) -> bool:
    objects = await kube.list("Notification", namespace)
    return len(objects) == COUNT and all(phase(o) == "Sent" for o in objects)


async def _assert_one_row_per_object_and_nothing_left(
    kube: Kube, namespace: str, db: Database, database_url: str
) -> None:
    uids = {o["metadata"]["uid"] for o in await kube.list("Notification", namespace)}
    rows = await sql(
        database_url,
        "SELECT idempotency_key, status FROM nq_all_notifications WHERE source = 'kubernetes'",
    )
    assert sorted(key for key, _ in rows) == sorted(f"k8s:{uid}" for uid in uids)
    assert {status for _, status in rows} == {"SENT"}
    lag = await db.fetch_one("status_outbox_lag", {"namespace": None})
    assert lag is not None and lag["queued"] == 0


@pytest.fixture
def operator_process(
    control_plane: LocalControlPlane, database_url: str, namespace: str, tmp_path: Path
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`notify-queue operator` processes this test starts (append); any left are killed."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def _start_operator_process(
    control_plane: LocalControlPlane, database_url: str, namespace: str, log: Path
) -> subprocess.Popen[bytes]:
    command = [
        str(Path(sys.executable).parent / "notify-queue"),
        "operator",
        "--database-url",
        database_url,
        "--namespace",
        namespace,
        "--status-patches-per-second",
        "500",
    ]
    env = dict(os.environ, KUBECONFIG=str(control_plane.kubeconfig))
    with log.open("ab") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)


async def test_an_operator_killed_mid_apply_and_restarted_makes_each_row_once_and_catches_up(
    control_plane: LocalControlPlane,
    kube: Kube,
    namespace: str,
    db: Database,
    database_url: str,
    operator_process: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    log = tmp_path / "operator.log"
    names = [f"k-{i:04d}" for i in range(COUNT)]

    def start(log: Path) -> subprocess.Popen[bytes]:
        return _start_operator_process(control_plane, database_url, namespace, log)

    async with running_worker(settings_for(database_url, namespace), db):
        operator_process.append(
            _start_operator_process(control_plane, database_url, namespace, log)
        )
        await _create(kube, namespace, names[: COUNT // 2])

        async def some_mirrored() -> bool:
            objects = await kube.list("Notification", namespace)
            return sum(1 for o in objects if phase(o)) >= 10

        await eventually(some_mirrored, timeout=120, what="the first objects mirrored")
        # Killed mid-work: handlers in flight, statuses queued, nothing flushed or said goodbye.
        operator_process[0].send_signal(signal.SIGKILL)
        operator_process[0].wait(timeout=30)
        await _create(kube, namespace, names[COUNT // 2 :])

        restarted = time.monotonic()
        operator_process.append(
            _start_operator_process(control_plane, database_url, namespace, log)
        )
        await eventually(
            lambda: _all_sent(kube, namespace), timeout=300, interval=0.5, what="all Sent"
        )
        print(f"{COUNT} objects: all Sent {time.monotonic() - restarted:.1f}s after the restart")
    await _assert_one_row_per_object_and_nothing_left(kube, namespace, db, database_url)


async def test_a_kube_apiserver_restart_mid_run_loses_nothing_and_makes_nothing_twice(
    control_plane: LocalControlPlane,
    namespace: str,
    start_operator: StartOperator,
    db: Database,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="kopf._cogs.clients.watching")
    names = [f"a-{i:04d}" for i in range(COUNT)]
    await start_operator(status_patches_per_second=500.0)
    async with running_worker(settings_for(database_url, namespace), db):
        first = Kube(control_plane)
        try:
            await _create(first, namespace, names[: COUNT // 2])
        finally:
            await first.close()
        await asyncio.to_thread(control_plane.restart_apiserver)
        restarted = time.monotonic()
        # A new client: the old one's pooled connections went with the old server.
        kube = Kube(control_plane)
        try:
            await _create(kube, namespace, names[COUNT // 2 :])
            await eventually(
                lambda: _all_sent(kube, namespace), timeout=300, interval=0.5, what="all Sent"
            )
            print(
                f"{COUNT} objects: all Sent {time.monotonic() - restarted:.1f}s after the restart"
            )
            await _assert_one_row_per_object_and_nothing_left(kube, namespace, db, database_url)
        finally:
            await kube.close()
    # The new server's watch cache starts after kopf's last resource version: 410 Gone, re-listed.
    relisted = [r for r in caplog.records if "Restarting the watch-stream" in r.getMessage()]
    assert relisted, "no watch got 410 Gone: the re-list was not exercised"


async def test_a_notification_deleted_while_no_operator_ran_is_cancelled_at_the_next_start(
    kube: Kube, namespace: str, start_operator: StartOperator, database_url: str
) -> None:
    """No finalizer holds the object, and no DELETED event reaches a stopped operator: the next
    one compares the links with the objects listed and cleans up."""
    operator = await start_operator()
    created = await kube.create(notification(namespace, "away", delay="1h"))
    key = f"k8s:{created['metadata']['uid']}"

    async def pending() -> bool:
        return phase(await kube.get("Notification", namespace, "away")) == "Pending"

    await eventually(pending, timeout=30, what="mirrored, Pending")
    await operator.stop()
    await kube.delete("Notification", namespace, "away")
    assert await kube.get("Notification", namespace, "away") is None  # gone at once

    await start_operator()

    async def cancelled_and_unlinked() -> bool:
        rows = await sql(
            database_url,
            "SELECT n.status, (SELECT count(*) FROM nq_kube_links) FROM nq_all_notifications n"
            " WHERE n.idempotency_key = %s",
            (key,),
        )
        return rows == [("CANCELLED", 0)]

    await eventually(cancelled_and_unlinked, timeout=30, what="CANCELLED, link dropped")
