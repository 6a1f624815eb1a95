"""The operator on the real Citus cluster (issue 21, "the operator's mirror and status"): a real
`notify-queue operator` process against the coordinator and a real kube-apiserver, with a
`notify-queue worker` process and an HTTP provider. Notifications applied as objects (an address,
a recipientId over two channels, two under a NotificationPolicy with ttlSecondsAfterFinished, one
delayed and deleted) are mirrored, each row reaches the provider once and ends SENT, `.status` is
written back as on plain PostgreSQL (phase, attempts, sentAt, status.notifications), the delayed
one's row is cancelled by its deletion, the TTL sweep deletes the policy's finished objects, and
the status outbox drains. The links and the outbox are plain tables on the coordinator there.

Real parts: the cluster of tests/citus/cluster.py (one per session), the operator tests' control
plane (etcd + kube-apiserver, one per session), `notify-queue migrate|operator|worker` as
processes, an HTTP provider on loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from notify_queue.devcluster import LocalControlPlane
from tests.citus.test_end_to_end import CountingProvider
from tests.citus.test_layout import migrate
from tests.operator.support import Kube, condition, notification, phase, policy
from tests.support import eventually

pytestmark = pytest.mark.citus

ADDRESSES = 3  # plain objects: an address each


@contextlib.contextmanager
def process(role: str, url: str, log_path: Path, *args: str, **env: str) -> Iterator[Path]:
    """`notify-queue <role>` against the coordinator, stopped with SIGTERM (as Kubernetes does)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFY_QUEUE_")}
    command = [sys.executable, "-m", "notify_queue", role, "--database-url", url, *args]
    with log_path.open("wb") as log:
        child = subprocess.Popen(
            command, env=environment | env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            yield log_path
        finally:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def rows(url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql, params).fetchall()


async def test_the_operator_mirrors_and_writes_status_back_on_citus(
    citus_database: str,
    control_plane: LocalControlPlane,
    tmp_path: Path,
) -> None:
    url = citus_database
    migrate(url)
    assert not rows(
        url,
        "SELECT logicalrelid FROM pg_dist_partition"
        " WHERE logicalrelid IN ('nq_kube_links'::regclass, 'nq_status_outbox'::regclass)",
    )
    # A stored recipient for the recipientId object, inserted directly (as
    # test_operator_escalation does): two channels with a contact, so two rows.
    rows(
        url,
        "INSERT INTO nq_recipients (id, email, phone)"
        " VALUES ('ana', 'a@x.test', '+4915112345678') RETURNING id",
    )
    kube = Kube(control_plane)
    provider = await CountingProvider().start()
    try:
        namespace = await kube.namespace_create()
        await kube.create(policy(namespace, "short-lived", ttlSecondsAfterFinished=1))
        operator_args = ["--namespace", namespace, "--status-patches-per-second", "500"]
        worker_args = ["--provider", "http", "--provider-url", provider.url]
        worker_args += ["--poll-interval", "0.5", "--backoff-base", "0.2", "--lease-seconds", "60"]
        with (
            process(
                "operator",
                url,
                tmp_path / "operator.log",
                *operator_args,
                KUBECONFIG=str(control_plane.kubeconfig),
            ) as operator_log,
            process("worker", url, tmp_path / "worker.log", *worker_args),
        ):

            async def policy_ready() -> bool:
                obj = await kube.get("NotificationPolicy", namespace, "short-lived")
                return (condition(obj, "Ready") or {}).get("status") == "True"

            await eventually(policy_ready, timeout=60, what="the policy Ready")
            for i in range(ADDRESSES):
                await kube.create(notification(namespace, f"plain-{i}", subject="Hi"))
            targeted = notification(namespace, "targeted", body="hi")
            targeted["spec"] = {"recipientId": "ana", "body": "hi"}
            await kube.create(targeted)
            for i in range(2):
                await kube.create(notification(namespace, f"brief-{i}", policy="short-lived"))
            await kube.create(notification(namespace, "later", delay="1h"))

            async def phases(*names: str) -> dict[str, str | None]:
                return {n: phase(await kube.get("Notification", namespace, n)) for n in names}

            kept = [f"plain-{i}" for i in range(ADDRESSES)] + ["targeted"]

            async def all_sent() -> bool:
                return set((await phases(*kept)).values()) == {"Sent"}

            await eventually(all_sent, timeout=60, what=f"Sent: {kept}")

            # Its Pending status is written back on its own (created last, it may come after the
            # others' Sent): waited for, not read once.
            async def later_pending() -> bool:
                return (await phases("later")) == {"later": "Pending"}

            try:
                await eventually(later_pending, timeout=60, what="later Pending")
            except AssertionError as exc:
                raise AssertionError(operator_log.read_text()) from exc

            async def briefs_gone() -> bool:
                return set((await phases("brief-0", "brief-1")).values()) == {None} and all(
                    [
                        await kube.get("Notification", namespace, f"brief-{i}") is None
                        for i in (0, 1)
                    ]
                )

            await eventually(briefs_gone, timeout=60, what="the TTL sweep")

            later = await kube.get("Notification", namespace, "later")
            assert later is not None
            later_id = later["status"]["notificationId"]
            await kube.delete("Notification", namespace, "later")

            async def later_gone() -> bool:
                return await kube.get("Notification", namespace, "later") is None

            await eventually(later_gone, timeout=30, what="the delete")

            # No finalizer: the row is cancelled on the DELETED event, after the object went.
            async def cancelled() -> bool:
                query = "SELECT status FROM nq_all_notifications WHERE id = %s"
                return rows(url, query, later_id) == [("CANCELLED",)]

            await eventually(cancelled, timeout=30, what="the deleted one CANCELLED")

            def outbox_empty() -> bool:
                return rows(url, "SELECT count(*) FROM nq_status_outbox") == [(0,)]

            async def drained() -> bool:
                return outbox_empty()

            await eventually(drained, timeout=30, what="the status outbox drained")
            objects = {n: await kube.get("Notification", namespace, n) for n in kept}
    finally:
        await provider.stop()
        await kube.close()

    # Every row of the objects went to the provider once and is SENT; the delayed one never did.
    statuses = dict(
        rows(url, "SELECT id::text, status FROM nq_all_notifications WHERE source = 'kubernetes'")
    )
    sent = {i for i, s in statuses.items() if s == "SENT"}
    assert len(sent) == ADDRESSES + 2 + 2  # the targeted object's two channels, the two briefs
    assert statuses[later_id] == "CANCELLED"
    assert dict(provider.sent) == dict.fromkeys(sent, 1)
    assert provider.calls == provider.sent

    for name, obj in objects.items():
        assert obj is not None
        status = obj["status"]
        assert status["phase"] == "Sent" and status["attempts"] == 1 and status["sentAt"]
        assert status["observedGeneration"] == 1
        assert statuses[status["notificationId"]] == "SENT"
        delivered = condition(obj, "Delivered")
        assert delivered is not None and (delivered["status"], delivered["reason"]) == (
            "True",
            "Sent",
        ), name
    related = objects["targeted"]["status"]["notifications"]  # type: ignore[index]
    assert len(related) == 2 and set(related) <= sent
    assert objects["plain-0"]["status"].get("notifications") is None  # type: ignore[index]

    # The deleted and the swept objects' links are gone; the kept ones' stay.
    links = {n for (n,) in rows(url, "SELECT name FROM nq_kube_links")}
    assert links == set(kept)
