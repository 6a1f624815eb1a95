"""The operator while PostgreSQL crashes and comes back (`immediate`: no checkpoint, crash
recovery at the next start), on the real kube-apiserver, with PostgreSQL's durable defaults.

Notifications are created before the crash and during it, and a worker delivers them across it.
Checked: the operator never exits; Notifications created while the database is away are
mirrored once it is back (kopf retries the handler); the status write-back reconnects by itself
and no update is lost: every object ends Sent, with the attempts of its row, each row linked once.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from notify_queue.devcluster import LocalControlPlane
from notify_queue.embedded import EmbeddedPostgres
from notify_queue.repositories.db import Database
from notify_queue.repositories.schema import migrate
from tests.operator.support import Kube, OperatorThread, notification, running_worker, settings_for
from tests.support import eventually

pytestmark = pytest.mark.kubernetes

DATABASE = "operator_restart"
DOWN_SECONDS = 2.0


@pytest.fixture
def restartable_pg() -> Iterator[EmbeddedPostgres]:
    """A server of its own with PostgreSQL's durable defaults (the session's runs with
    synchronous_commit off, where a crash may lose commits by design), in a directory of its
    own (not pytest's tmp, which a concurrent pytest run may prune or lock down)."""
    root = Path(tempfile.mkdtemp(prefix="notify-queue-pg-restart-"))
    server = EmbeddedPostgres(root / "data", delete_on_stop=True)
    try:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")
            durable = conn.execute("SHOW synchronous_commit").fetchone()
            assert durable is not None and durable[0] == "on"

        async def prepare() -> None:
            async with Database(server.url(DATABASE), pool_size=1) as db:
                await migrate(db)

        asyncio.run(prepare())
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.resume()  # a test that failed while the server was down leaves it stopped
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


async def test_mirroring_and_status_write_back_survive_a_database_crash(
    kube: Kube,
    namespace: str,
    control_plane: LocalControlPlane,
    restartable_pg: EmbeddedPostgres,
) -> None:
    url = restartable_pg.url(DATABASE)
    kubeconfig = control_plane.kubeconfig
    operator = await OperatorThread(
        settings_for(url, namespace, database_pool_size=4), kubeconfig
    ).start()
    worker_db = Database(url, pool_size=4)
    await worker_db.open(wait=False)
    try:
        before = [f"before-{i}" for i in range(5)]
        during = [f"during-{i}" for i in range(5)]
        for name in before:  # due in a moment: delivered around the crash
            await kube.create(notification(namespace, name, delay="2s"))
        await eventually(lambda: _all_in(kube, namespace, before, {"Pending"}), timeout=20)
        async with running_worker(settings_for(url, namespace), worker_db):
            await asyncio.to_thread(restartable_pg.halt, mode="immediate")
            for name in during:
                await kube.create(notification(namespace, name))
            await asyncio.sleep(DOWN_SECONDS)  # an outage lasts a while; nothing to poll for
            assert operator.error is None, operator.error
            await asyncio.to_thread(restartable_pg.resume)
            await eventually(
                lambda: _all_in(kube, namespace, before + during, {"Sent"}),
                timeout=90,
                what="every Notification Sent",
            )
        assert operator.error is None, operator.error
        # No update lost: each object shows its row's final state, one row per object.
        with psycopg.connect(url) as conn:
            rows = dict(
                conn.execute(
                    "SELECT l.name, n.attempt_count FROM nq_kube_links l "
                    "JOIN nq_all_notifications n ON n.id = l.notification_id "
                    "WHERE l.namespace = %s AND n.status = 'SENT'",
                    (namespace,),
                ).fetchall()
            )
            (outbox,) = conn.execute("SELECT count(*) FROM nq_status_outbox").fetchone() or (0,)
        assert sorted(rows) == sorted(before + during)
        for name in before + during:
            obj = await kube.get("Notification", namespace, name)
            assert obj is not None
            assert obj["status"]["attempts"] == rows[name], name
            uuid.UUID(obj["status"]["notificationId"])
        assert outbox == 0
    finally:
        await operator.stop()
        await worker_db.close()


async def _all_in(kube: Kube, namespace: str, names: list[str], phases: set[str]) -> bool:
    for name in names:
        obj = await kube.get("Notification", namespace, name)
        if ((obj or {}).get("status") or {}).get("phase") not in phases:
            return False
    return True
