"""The worker loop: claim, deliver, complete, all in batches.

One process runs a few cooperating tasks on one event loop:

- the claimer takes a batch (one claim transaction) whenever delivery slots are free, and
  otherwise sleeps until a wake-up (LISTEN/NOTIFY), the next scheduled notification is due, or the
  poll interval passes, whichever is first;
- each claimed notification is delivered concurrently, bounded by --concurrency; no database
  connection or lock is held while a provider is called. A delivery is started inline and gets
  a task of its own only if the provider actually waits (network I/O): a provider that answers
  at once (the simulated one, a rejection decided locally) costs no task, no scheduling round
  and no callback, which at tens of thousands of deliveries a second is most of the worker's time;
- the completer writes results as they arrive, as many as have accumulated per statement (status,
  webhook event and rate-limit slot together), so under load one round trip records hundreds;
- housekeeping recovers expired leases, expires overdue notifications and prunes old slots;
- the webhook dispatcher relays the outbox.

On SIGTERM the claimer stops, deliveries in flight get --shutdown-grace-seconds to finish, and
what is still unfinished is handed back without using an attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any

from notify_queue.errors import DatabaseUnavailable
from notify_queue.models import Channel, ClaimedNotification, DeliveryResult, Outcome, Status
from notify_queue.providers.base import DeliveryRequest, Provider
from notify_queue.services.delivery import DeliveryService
from notify_queue.worker.dispatcher import WebhookDispatcher
from notify_queue.worker.metrics import DELIVERIES, DELIVERY_DURATION, STALE_RESULTS
from notify_queue.worker.waiting import wait_any

log = logging.getLogger(__name__)

_COMPLETE_CHUNK = 1000
_RETRY_DB_SECONDS = 1.0


class Worker:
    def __init__(
        self,
        service: DeliveryService,
        providers: dict[Channel, Provider],
        dispatcher: WebhookDispatcher | None,
        *,
        concurrency: int,
        batch_size: int,
        poll_interval: float,
        shutdown_grace_seconds: float,
    ) -> None:
        self._service = service
        self._providers = providers
        self._dispatcher = dispatcher
        self._concurrency = concurrency
        self._batch_size = batch_size
        self._poll_interval = poll_interval
        self._grace = shutdown_grace_seconds
        self._in_flight: dict[asyncio.Task[None], ClaimedNotification] = {}
        self._results: list[tuple[ClaimedNotification, DeliveryResult]] = []
        self._results_ready = asyncio.Event()
        self._slot_free = asyncio.Event()
        self._wake = asyncio.Event()
        self._claiming_stopped = asyncio.Event()
        self._stop = asyncio.Event()
        # Labelled metric children, looked up once: `labels()` takes a lock and builds a key.
        self._durations: dict[str, Any] = {}
        self._outcomes: dict[tuple[str, Outcome], Any] = {}

    # -- lifecycle -------------------------------------------------------------------------

    def stop(self) -> None:
        """Begin a graceful shutdown (SIGTERM, Ctrl-C)."""
        self._claiming_stopped.set()

    async def run(self) -> None:
        background = [
            asyncio.create_task(self._listen(), name="listen"),
            asyncio.create_task(self._complete_forever(), name="complete"),
            asyncio.create_task(self._housekeeping_forever(), name="housekeeping"),
        ]
        if self._dispatcher is not None:
            background.append(
                asyncio.create_task(self._dispatcher.run(self._stop), name="webhooks")
            )
        try:
            await self._claim_forever()
            await self._drain()
        finally:
            self._stop.set()
            self._results_ready.set()
            for task in background:
                task.cancel()
            for task in background:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _drain(self) -> None:
        """Let deliveries in flight finish within the grace period; hand the rest back."""
        if self._in_flight:
            log.info(
                "shutting down: waiting up to %.0fs for %d deliveries",
                self._grace,
                len(self._in_flight),
            )
            await asyncio.wait(list(self._in_flight), timeout=self._grace)
        unfinished = list(self._in_flight.items())
        for task, _ in unfinished:
            task.cancel()
        for task, _ in unfinished:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._flush_results()
        if unfinished:
            released = await self._service.release([claimed for _, claimed in unfinished])
            log.info("handed back %d unfinished notifications without using an attempt", released)

    # -- claiming ---------------------------------------------------------------------------

    async def _claim_forever(self) -> None:
        while not self._claiming_stopped.is_set():
            free = self._concurrency - len(self._in_flight)
            if free <= 0:
                self._slot_free.clear()
                await wait_any(self._slot_free, self._claiming_stopped, timeout=self._poll_interval)
                continue
            limit = min(self._batch_size, free)
            try:
                batch = await self._service.claim(limit)
            except DatabaseUnavailable as exc:
                log.warning("claim failed: %s; retrying", exc)
                await wait_any(self._claiming_stopped, timeout=_RETRY_DB_SECONDS)
                continue
            for channel in batch.rate_limited:
                DELIVERIES.labels(channel.value, Outcome.RATE_LIMITED.value).inc()
            for claimed in batch.claimed:
                self._start_delivery(claimed)
            if self._results:
                self._results_ready.set()
            if len(batch.claimed) + len(batch.rate_limited) >= limit:
                continue  # more may be due right now
            self._wake.clear()
            try:
                wait = await self._service.seconds_until_due(ceiling=self._poll_interval)
            except DatabaseUnavailable:
                wait = _RETRY_DB_SECONDS
            if wait > 0:
                await wait_any(self._wake, self._claiming_stopped, timeout=wait)

    def _start_delivery(self, claimed: ClaimedNotification) -> None:
        """Run the delivery up to its first real wait; only then does it become a task."""
        coro = self._deliver(claimed)
        try:
            waiting_on = coro.send(None)
        except StopIteration:
            return  # finished without waiting: its result is already queued for completion
        except Exception:
            log.exception("delivery of %s failed to start", claimed.id)
            return  # its lease runs out and the housekeeping hands it back
        task = asyncio.create_task(_resume(coro, waiting_on))
        self._in_flight[task] = claimed
        task.add_done_callback(self._delivery_done)

    def _delivery_done(self, task: asyncio.Task[None]) -> None:
        self._in_flight.pop(task, None)
        self._slot_free.set()

    async def _listen(self) -> None:
        async for _ in self._service.wakeups(self._stop):
            self._wake.set()

    # -- delivering -------------------------------------------------------------------------

    async def _deliver(self, claimed: ClaimedNotification) -> None:
        provider = self._providers[claimed.channel]
        request = DeliveryRequest(
            id=claimed.id,
            channel=claimed.channel,
            recipient=claimed.recipient,
            subject=claimed.subject,
            body=claimed.body,
            metadata=claimed.metadata,
        )
        started = time.perf_counter()
        try:
            result = await provider.deliver(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a provider bug must not kill the worker; retry it later
            log.exception("provider raised for %s", claimed.id)
            result = DeliveryResult(Outcome.TEMPORARY_FAILURE, error=f"provider error: {exc!r}")
        channel = claimed.channel.value
        duration = self._durations.get(channel)
        if duration is None:
            duration = self._durations[channel] = DELIVERY_DURATION.labels(channel)
        duration.observe(time.perf_counter() - started)
        counter = self._outcomes.get((channel, result.outcome))
        if counter is None:
            counter = self._outcomes[(channel, result.outcome)] = DELIVERIES.labels(
                channel, result.outcome.value
            )
        counter.inc()
        self._results.append((claimed, result))
        self._results_ready.set()

    # -- completing -------------------------------------------------------------------------

    async def _complete_forever(self) -> None:
        while not self._stop.is_set():
            await self._results_ready.wait()
            self._results_ready.clear()
            await self._flush_results()

    async def _flush_results(self) -> None:
        while self._results:
            chunk, self._results = self._results[:_COMPLETE_CHUNK], self._results[_COMPLETE_CHUNK:]
            while True:
                try:
                    completions, accepted = await self._service.complete(chunk)
                    break
                except DatabaseUnavailable as exc:
                    # Results are kept and written once the database is back; the leases are
                    # long enough that nobody else takes these notifications meanwhile.
                    log.warning("recording %d results failed: %s; retrying", len(chunk), exc)
                    await asyncio.sleep(_RETRY_DB_SECONDS)
            stale = len(chunk) - len(accepted)
            if stale:
                STALE_RESULTS.inc(stale)
                log.warning("%d results arrived after their claim expired; dropped", stale)
            if self._dispatcher is not None and any(
                c.status is not Status.PENDING for c in completions
            ):
                self._dispatcher.poke()

    # -- housekeeping -----------------------------------------------------------------------

    async def _housekeeping_forever(self) -> None:
        last_prune = 0.0
        while not self._stop.is_set():
            try:
                recovered, dead, expired = await self._service.housekeeping()
                if recovered or expired:
                    log.info(
                        "recovered %d expired leases (%d dead-lettered), expired %d",
                        recovered,
                        dead,
                        expired,
                    )
                    self._wake.set()
                if time.monotonic() - last_prune > 60:
                    await self._service.prune_rate_slots()
                    last_prune = time.monotonic()
            except DatabaseUnavailable as exc:
                log.warning("housekeeping skipped: %s", exc)
            await wait_any(self._stop, timeout=self._poll_interval)


async def _resume(coro: Coroutine[Any, Any, None], waiting_on: Any) -> None:
    """Carry on a coroutine that was started by hand and is suspended on `waiting_on`.

    Does what an asyncio task's step does: wait for the future the coroutine yielded (a bare
    `yield`, as in `sleep(0)`, yields None), then resume it. The awaited future's own result or
    exception the coroutine reads itself when resumed; this task's cancellation is thrown into
    it, so it sees CancelledError exactly as it would in a task of its own.
    """
    while True:
        try:
            if waiting_on is None:
                await asyncio.sleep(0)
            else:
                # What a task does with a yielded future: it is now ours to wait on.
                waiting_on._asyncio_future_blocking = False
                await waiting_on
        except BaseException as exc:
            if (
                waiting_on is None
                or not waiting_on.done()
                or (not waiting_on.cancelled() and waiting_on.exception() is None)
            ):
                try:
                    waiting_on = coro.throw(exc)
                except StopIteration:
                    return
                continue
        try:
            waiting_on = coro.send(None)
        except StopIteration:
            return
