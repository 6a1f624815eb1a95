"""The TTL sweeper: deletes finished Notification objects `ttlSecondsAfterFinished` after they
finished, when their policy sets it.

One task for all objects: one query takes the objects that are due (and marks them), the task
deletes them (16 at a time), then sleeps exactly until the next one is due, as the database
says; the status writer pokes it when an object finishes, so a TTL of 0 acts at once. No timer
per object. Its link is dropped once the delete is done (its row is final: nothing to cancel).
"""

from __future__ import annotations

import asyncio
import logging

from notify_queue.errors import DatabaseUnavailable, NotifyQueueError
from notify_queue.operator import metrics
from notify_queue.operator.kubeapi import KubeApi
from notify_queue.operator.waiting import pause
from notify_queue.repositories.kube import KubeLink, KubeRepository
from notify_queue.services.kube import NOTIFICATIONS

log = logging.getLogger(__name__)


class TtlSweeper:
    def __init__(
        self,
        repository: KubeRepository,
        kube: KubeApi,
        *,
        namespace: str | None,
        batch_size: int = 100,
        concurrency: int = 16,
        max_sleep_seconds: float = 30.0,
    ) -> None:
        self._repository = repository
        self._kube = kube
        self._namespace = namespace
        self._batch_size = batch_size
        # Deletes in flight at once: one at a time, a round trip each, is the API server's
        # latency per object (about 20 a second on a busy one).
        self._concurrency = concurrency
        # A policy whose TTL changed, or a notification finished while the writer was busy, is
        # noticed within this long even without a poke.
        self._max_sleep_seconds = max_sleep_seconds
        self._poke = asyncio.Event()

    def poke(self) -> None:
        """Something finished: look again now."""
        self._poke.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._poke.clear()
            try:
                while await self.sweep() == self._batch_size:
                    pass
                next_due = await self._repository.kube_finished_next_due(namespace=self._namespace)
            except (DatabaseUnavailable, NotifyQueueError) as exc:
                log.warning("TTL sweep paused: %s", exc)
                next_due = 1.0
            sleep = (
                self._max_sleep_seconds
                if next_due is None
                else min(max(next_due, 0.05), self._max_sleep_seconds)
            )
            await pause(stop, sleep, self._poke)

    async def sweep(self) -> int:
        """Delete the objects due now; return how many were due."""
        due = await self._repository.kube_finished_take_due(
            namespace=self._namespace, limit=self._batch_size
        )
        limit = asyncio.Semaphore(self._concurrency)

        async def delete(link: KubeLink) -> None:
            async with limit:
                deleted = await self._kube.custom_object_delete(
                    plural=NOTIFICATIONS, namespace=link.namespace, name=link.name, uid=link.uid
                )
            if deleted:
                metrics.TTL_DELETIONS.inc()
                log.info(
                    "deleted finished Notification %s/%s (ttlSecondsAfterFinished)",
                    link.namespace,
                    link.name,
                )
            # Gone either way (deleted now, or before): its link goes now, not when the DELETED
            # event comes through kopf's queue, which lags in a burst (a link left would be
            # taken again a minute later, one more DELETE for an object already gone).
            await self._repository.kube_link_delete(uid=link.uid)

        await asyncio.gather(*(delete(link) for link in due))
        return len(due)
