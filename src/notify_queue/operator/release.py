"""Release the cluster's objects when the operator goes away for good (`helm uninstall`).

Every NotificationPolicy the operator handled carries its finalizer (and so may a Notification
an older operator handled). With no operator left, nothing removes those finalizers: the objects,
and their namespaces, would stay Terminating forever. And a Pending Notification's row would stay
PENDING with nobody to serve its object. This one-shot step (the chart's pre-delete hook runs
it; `python -m notify_queue.operator.release`):

1. scales the operator's Deployment to 0 and waits until its pods are gone, so no operator adds
   a finalizer back behind us;
2. for each linked Notification: cancels its notification if still PENDING (a final one is left
   as it is), forgets the link, removes the finalizer if it has one; for each
   NotificationPolicy: removes the finalizer (the policy's row stays);
3. goes over the objects again until a pass finds nothing to release (a dying operator may have
   added one back), within a deadline.

Idempotent: running it twice, or after a partial run, releases what is left.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from notify_queue.operator.kubeapi import KubeApi, load_kube_configuration
from notify_queue.operator.main import FINALIZER
from notify_queue.operator.mirror import NotificationMirror
from notify_queue.repositories.db import Database
from notify_queue.repositories.kube import KubeRepository
from notify_queue.repositories.notifications import NotificationRepository
from notify_queue.services.kube import NOTIFICATIONS, POLICIES
from notify_queue.services.notifications import NotificationService

log = logging.getLogger(__name__)


@dataclass
class Released:
    notifications: int = 0
    policies: int = 0


async def release(
    *,
    database_url: str,
    namespace: str | None,
    operator_namespace: str | None = None,
    operator_deployment: str | None = None,
    kubeconfig: Path | None = None,
    timeout_seconds: float = 120.0,
) -> Released:
    """Stop the operator (if named), then release every object in `namespace` (None: all)."""
    kube = KubeApi(load_kube_configuration(kubeconfig))
    # Never prepared on the server: a one-off run gains nothing by it, and it then works through
    # any pooler the operator's URL goes through.
    db = Database(database_url, pool_size=2, name="notify-queue-release", prepared_statements=False)
    deadline = time.monotonic() + timeout_seconds
    try:
        await db.open()
        if operator_deployment and operator_namespace:
            await _stop_operator(kube, operator_namespace, operator_deployment, deadline)
        links = KubeRepository(db)
        mirror = NotificationMirror(
            NotificationService(NotificationRepository(db), default_max_attempts=1),
            links,
            kube,
            database_concurrency=1,
        )
        total = Released()
        while True:
            released = await _release_once(kube, links, mirror, namespace)
            total.notifications += released.notifications
            total.policies += released.policies
            if released.notifications == released.policies == 0:
                return total
            if time.monotonic() > deadline:
                raise TimeoutError("objects kept getting finalizers back: is an operator running?")
    finally:
        await kube.close()
        await db.close()


async def _stop_operator(kube: KubeApi, namespace: str, name: str, deadline: float) -> None:
    if await kube.deployment_replicas(namespace=namespace, name=name) is None:
        return
    await kube.deployment_scale(namespace=namespace, name=name, replicas=0)
    log.info("scaled the operator %s/%s to 0; waiting for its pods to go", namespace, name)
    while (await kube.deployment_replicas(namespace=namespace, name=name) or 0) > 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the operator {namespace}/{name} did not stop")
        await asyncio.sleep(0.5)


async def _release_once(
    kube: KubeApi, links: KubeRepository, mirror: NotificationMirror, namespace: str | None
) -> Released:
    released = Released()
    for plural in (NOTIFICATIONS, POLICIES):
        for obj in await kube.custom_objects_list(plural=plural, namespace=namespace):
            meta = obj["metadata"]
            finalized = FINALIZER in (meta.get("finalizers") or [])
            linked = (
                plural == NOTIFICATIONS and await links.kube_link_get(uid=meta["uid"]) is not None
            )
            if not finalized and not linked:
                continue
            if plural == NOTIFICATIONS:
                await mirror.deleted(uid=meta["uid"])  # cancels a PENDING row, drops the link
            removed = finalized and await kube.finalizer_remove(
                plural=plural,
                namespace=meta["namespace"],
                name=meta["name"],
                uid=meta["uid"],
                finalizer=FINALIZER,
            )
            if removed:
                log.info("released %s %s/%s", plural, meta["namespace"], meta["name"])
            if plural == NOTIFICATIONS:
                released.notifications += 1
            else:
                released.policies += 1
    return released


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m notify_queue.operator.release",
        description="Stop the operator and release its objects (cancel pending Notifications, "
        "remove finalizers), before the operator is uninstalled.",
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("NOTIFY_QUEUE_DATABASE_URL"),
        help="libpq URI of the queue's database [$NOTIFY_QUEUE_DATABASE_URL]",
    )
    parser.add_argument(
        "--namespace",
        default=os.environ.get("NOTIFY_QUEUE_NAMESPACE"),
        help="the operator's watched namespace [$NOTIFY_QUEUE_NAMESPACE; unset: all]",
    )
    parser.add_argument("--operator-namespace", help="namespace of the operator's Deployment")
    parser.add_argument("--operator-deployment", help="the operator's Deployment, scaled to 0")
    parser.add_argument("--kubeconfig", type=Path, help="default: in-cluster or $KUBECONFIG")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds [120]")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.database_url:
        parser.error("--database-url (or NOTIFY_QUEUE_DATABASE_URL) is required")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        released = asyncio.run(
            release(
                database_url=args.database_url,
                namespace=args.namespace or None,
                operator_namespace=args.operator_namespace,
                operator_deployment=args.operator_deployment,
                kubeconfig=args.kubeconfig,
                timeout_seconds=args.timeout,
            )
        )
    except Exception as exc:  # one line, as every command of this program
        print(f"release failed: {exc}", file=sys.stderr)
        return 1
    print(
        f"released {released.notifications} Notifications and {released.policies} "
        "NotificationPolicies"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
