"""The waiting refresher: a Notification's `status.waiting` follows time and the workers.

The status writer patches an object when its row changes; a waiting reason also goes stale
without any write: its `until` passes (the row is due), or the workers serving its channel and
lane start or stop (it waits `NoWorker`, or no longer does). One task for all objects, like the
TTL sweeper: it reads when the next `until` comes (one index probe) and sleeps until then, or
`LANES_LOOK_SECONDS` at most to read the lanes live workers serve; each time, it queues a status
write for the objects whose reason ran out since its last look or whose lane changed, and pokes
the writer, which re-reads each row. No timer per object (docs/operator.md "Status").
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from notify_queue.errors import DatabaseUnavailable
from notify_queue.operator.status import StatusWriter
from notify_queue.operator.waiting import pause
from notify_queue.repositories.kube import KubeRepository
from notify_queue.services.waiting import ALL_LANES, LiveLanes

log = logging.getLogger(__name__)

# How soon a worker that starts or stops shows on the objects of its lanes: one read of the
# workers' heartbeats (a row per worker) this often.
LANES_LOOK_SECONDS = 5.0


class WaitingRefresher:
    def __init__(
        self,
        repository: KubeRepository,
        lanes: LiveLanes,
        writer: StatusWriter,
        *,
        namespace: str | None,
    ) -> None:
        self._repository = repository
        self._lanes = lanes
        self._writer = writer
        self._namespace = namespace

    async def run(self, stop: asyncio.Event) -> None:
        # The first look refreshes every reason that ran out and every object of an unserved
        # lane: what went stale while no operator ran.
        after = datetime.min.replace(tzinfo=UTC)
        unserved_before = ALL_LANES
        first = True
        while not stop.is_set():
            sleep = LANES_LOOK_SECONDS
            try:
                unserved = ALL_LANES - await self._lanes.served(fresh=True)
                next_until, now = await self._repository.waiting_refresh_next()
                changed = unserved if first else unserved ^ unserved_before
                queued = await self._repository.waiting_refresh_queue(
                    after=after, upto=now, lanes=changed, namespace=self._namespace
                )
                if queued:
                    self._writer.poke()
                after, unserved_before, first = now, unserved, False
                if next_until is not None:
                    sleep = min(max((next_until - now).total_seconds(), 0.05), sleep)
            except DatabaseUnavailable as exc:
                log.warning("waiting refresh paused: %s", exc)
            await pause(stop, sleep)
