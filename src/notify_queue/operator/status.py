"""Status write-back: one task that carries changes of linked rows to their objects' `.status`.

A trigger fills the status outbox with one row per change of a Kubernetes row (migration 0003)
and sends one NOTIFY per transaction. This task LISTENs, and on every wake-up (and on start and
after a reconnect, to catch up; and every `fallback_poll_seconds` in case a hint was lost) drains
the outbox: a batch of the oldest changes, coalesced per object, each written as one merge patch
built from the row's current state, at most `patches_per_second`, and the batch's outbox rows
deleted once their patches went through. A patch that fails leaves its rows for the next round.
A wake-up is followed by a pause of `coalesce_seconds` before the drain, so a notification that
is sent within it gets one patch (Sent), not two (Pending, then Sent).

So the cost follows the rate of change, not the number of objects: there is no timer, daemon or
poll per object, and 2,000 idle Notifications cost nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from notify_queue.errors import DatabaseUnavailable, NotifyQueueError
from notify_queue.models import Status
from notify_queue.operator import metrics
from notify_queue.operator.kubeapi import KubeApi, KubeUnavailable, PatchOutcome
from notify_queue.operator.waiting import pause
from notify_queue.repositories.kube import KubeRepository, StatusChange
from notify_queue.repositories.workers import Lanes
from notify_queue.services.kube import NOTIFICATIONS, object_reference
from notify_queue.services.kube_status import notification_status
from notify_queue.services.waiting import ALL_LANES, LiveLanes, with_no_worker

log = logging.getLogger(__name__)

# Transitions worth a Kubernetes Event: a person should look at these.
_EVENT_REASONS = {Status.DEAD_LETTERED: "DeadLettered", Status.FAILED: "DeliveryFailed"}


class RateLimiter:
    """A token bucket: at most `rate` acquisitions a second, bursts up to `burst`."""

    def __init__(self, rate: float, *, burst: float | None = None) -> None:
        self._rate = rate
        self._capacity = max(burst if burst is not None else rate / 5, 1.0)
        self._tokens = self._capacity
        self._updated = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:
            while True:
                now = time.monotonic()
                self._tokens = min(
                    self._capacity, self._tokens + (now - self._updated) * self._rate
                )
                self._updated = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                await asyncio.sleep((1 - self._tokens) / self._rate)


class StatusWriter:
    def __init__(
        self,
        repository: KubeRepository,
        kube: KubeApi,
        *,
        namespace: str | None,
        batch_size: int,
        patches_per_second: float,
        concurrency: int = 16,
        coalesce_seconds: float = 1.0,
        fallback_poll_seconds: float = 5.0,
        on_finished: Callable[[], None] = lambda: None,
        on_gone: Callable[[str], Awaitable[None]] | None = None,
        lanes: LiveLanes | None = None,
    ) -> None:
        self._repository = repository
        self._kube = kube
        self._namespace = namespace
        self._batch_size = batch_size
        self._limiter = RateLimiter(patches_per_second)
        self._concurrency = asyncio.Semaphore(concurrency)
        self._coalesce_seconds = coalesce_seconds
        self._fallback_poll_seconds = fallback_poll_seconds
        self._on_finished = on_finished
        # The clean-up of an object found gone (its DELETED event was missed: the operator was
        # down, or the database was when it came).
        self._on_gone = on_gone
        # The lanes live workers serve: a due notification none serves shows `NoWorker`.
        self._lanes = lanes
        self._served: Lanes = ALL_LANES
        self._wake = asyncio.Event()

    def poke(self) -> None:
        """Changes were queued by this process: drain now."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        listener = asyncio.create_task(self._listen(stop), name="status outbox listener")
        try:
            while not stop.is_set():
                try:
                    await self.drain()
                    await self._report_lag()
                except (DatabaseUnavailable, KubeUnavailable) as exc:
                    log.warning("status write-back paused: %s", exc)
                    await pause(stop, 1.0)
                    continue
                await pause(stop, self._fallback_poll_seconds, self._wake)
                self._wake.clear()
                # The changes of a burst gather first: a notification that goes Pending → Sent
                # within this pause is written once, as Sent.
                await pause(stop, self._coalesce_seconds)
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)

    async def _listen(self, stop: asyncio.Event) -> None:
        async for _ in self._repository.status_outbox_wakeups(stop):
            self._wake.set()

    async def drain(self) -> int:
        """Write back everything queued now; return the number of objects patched."""
        patched = 0
        while True:
            async with self._repository.status_outbox_batch(
                namespace=self._namespace, limit=self._batch_size
            ) as batch:
                # None: another replica is writing this scope's batch right now.
                if batch is None or not batch.changes:
                    return patched
                if self._lanes is not None:
                    self._served = await self._lanes.served()
                results = await asyncio.gather(*(self._write(c) for c in batch.changes))
                written = [c for c, ok in zip(batch.changes, results, strict=True) if ok]
                await batch.delete([seq for c in written for seq in c.outbox_seqs])
                patched += sum(1 for c in written if c.linked)
            # A short batch was the last; a failed patch waits for the next round (a wake-up or
            # the fallback poll) instead of being retried in a tight loop.
            if len(batch.changes) < self._batch_size or len(written) < len(batch.changes):
                return patched

    async def _write(self, change: StatusChange) -> bool:
        """Patch one object; True when its outbox rows are done (written, or nowhere to write)."""
        n = change.notification
        if not change.linked or n is None:
            return True
        status = notification_status(
            with_no_worker(n, self._served),
            generation=change.generation,
            finished_at=change.finished_at,
            policy_ready=change.policy_ready,
            policy_exists=change.policy_exists,
            related=change.related,
            escalation=(
                None
                if change.escalation is None
                else (change.escalation.id, change.escalation.state.value)
            ),
        )
        async with self._concurrency:
            await self._limiter.acquire()
            try:
                outcome = await self._kube.status_patch(
                    plural=NOTIFICATIONS,
                    namespace=change.namespace,
                    name=change.name,
                    uid=change.uid,
                    status=status,
                )
            except NotifyQueueError as exc:
                metrics.STATUS_PATCHES.labels("failed").inc()
                log.warning("status of %s/%s not written: %s", change.namespace, change.name, exc)
                # Refused for good (a 4xx): retrying the same patch cannot help.
                return not isinstance(exc, KubeUnavailable)
        metrics.STATUS_PATCHES.labels(outcome.value).inc()
        if outcome is PatchOutcome.GONE and self._on_gone is not None:
            try:
                await self._on_gone(change.uid)
            except NotifyQueueError as exc:  # the link stays; the row's next change tries again
                log.warning("clean-up of gone %s/%s failed: %s", change.namespace, change.name, exc)
        if outcome is PatchOutcome.PATCHED:
            involved = object_reference(
                kind="Notification", namespace=change.namespace, name=change.name, uid=change.uid
            )
            for entered in sorted(change.entered_statuses & _EVENT_REASONS.keys()):
                message = next(
                    c["message"] for c in status["conditions"] if c["type"] == "Delivered"
                )
                self._kube.event_soon(
                    involved=involved,
                    type="Warning",
                    reason=_EVENT_REASONS[entered],
                    message=message,
                )
        if n.status.is_final:
            self._on_finished()
        return True

    async def _report_lag(self) -> None:
        queued, age = await self._repository.status_outbox_lag(namespace=self._namespace)
        metrics.OUTBOX_QUEUED.set(queued)
        metrics.OUTBOX_LAG.set(age)
