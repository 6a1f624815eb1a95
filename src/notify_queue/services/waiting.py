"""`NoWorker`: a due notification that no live worker would ever claim says so.

Each worker keeps a heartbeat row with the lanes it serves, its channels and priorities
(`WorkerHeartbeat`, every `HEARTBEAT_SECONDS`; deleted when it stops cleanly); one silent for
`LIVE_SECONDS` is gone. A PENDING notification with no reason that still holds (due, or its
reason's `until` passed) in a lane no live worker serves waits `NoWorker`, with no `until`: it is
due as soon as such a worker starts. Computed when read from the lanes, never written to the row:
it changes with the workers, not with the notification (docs/design.md "Why a notification
waits").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Sequence

from notify_queue.errors import DatabaseUnavailable
from notify_queue.models import Channel, Notification, Priority, Status, Waiting, WaitingReason
from notify_queue.repositories.workers import Lanes, WorkerRepository

log = logging.getLogger(__name__)

# A beat every 15 s costs an idle worker one statement in 15 s; three beats missed (a killed
# worker, a lost connection) and its lanes count as unserved.
HEARTBEAT_SECONDS = 15.0
LIVE_SECONDS = 3 * HEARTBEAT_SECONDS
# How long a reader keeps the lanes it read: a worker that starts or stops shows within this.
_LANES_TTL_SECONDS = 2.0

ALL_LANES: Lanes = frozenset((c, p) for c in Channel for p in Priority)


def no_worker_waiting(channel: Channel, priority: Priority) -> Waiting:
    return Waiting(
        WaitingReason.NO_WORKER,
        None,
        f"no live worker serves channel {channel.value} in lane {priority.value}",
    )


def with_no_worker(notification: Notification, served: Lanes) -> Notification:
    """`notification`, waiting `NoWorker` when it waits for a worker only and none serves it."""
    n = notification
    if n.status is Status.PENDING and n.waiting is None and (n.channel, n.priority) not in served:
        n.waiting = no_worker_waiting(n.channel, n.priority)
    return n


class LiveLanes:
    """The lanes live workers serve, read at most once per `_LANES_TTL_SECONDS` per process."""

    def __init__(self, repository: WorkerRepository) -> None:
        self._repository = repository
        self._lanes: Lanes = frozenset()
        self._read_at = float("-inf")

    async def served(self, *, fresh: bool = False) -> Lanes:
        if fresh or time.monotonic() - self._read_at > _LANES_TTL_SECONDS:
            self._lanes = await self._repository.worker_lanes_served(live_seconds=LIVE_SECONDS)
            self._read_at = time.monotonic()
        return self._lanes

    async def unserved(self) -> Lanes:
        return ALL_LANES - await self.served()

    async def apply(self, notifications: Sequence[Notification]) -> None:
        """Mark those that wait for a worker no live one is (one read, only when one might)."""
        candidates = [n for n in notifications if n.status is Status.PENDING and n.waiting is None]
        if candidates:
            served = await self.served()
            for n in candidates:
                with_no_worker(n, served)


class WorkerHeartbeat:
    """One worker's heartbeat row: written at start and every `HEARTBEAT_SECONDS`, deleted at a
    clean stop."""

    def __init__(
        self,
        repository: WorkerRepository,
        *,
        channels: Sequence[Channel],
        priorities: Sequence[Priority],
    ) -> None:
        self._repository = repository
        self._channels = channels
        self._priorities = priorities
        self.id = uuid.uuid4()

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    await self._repository.worker_heartbeat(
                        id=self.id, channels=self._channels, priorities=self._priorities
                    )
                except DatabaseUnavailable as exc:
                    log.warning("heartbeat not written: %s", exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=HEARTBEAT_SECONDS)
        finally:
            if stop.is_set():
                with contextlib.suppress(DatabaseUnavailable):
                    await self._repository.worker_forget(id=self.id)
