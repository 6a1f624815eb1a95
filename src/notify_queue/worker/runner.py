"""The worker loop: claim, deliver, complete, all in batches.

One process runs a few cooperating tasks on one event loop, each supervised (`supervision`): an
unexpected exception is logged with its traceback, shows on `/healthz`, and the task starts again
after a backoff. No task dies silently.

- the claimer takes a batch (one claim transaction) whenever delivery slots are free, and
  otherwise sleeps until a wake-up (LISTEN/NOTIFY), the next due notification of its own lanes,
  or the safety look (every 30 s), whichever is first; it pauses while results cannot be
  recorded, so it never takes work it could not report;
- the listener holds the LISTEN connection; while that connection is down, hints can be lost, so
  the claimer and housekeeping look every --poll-interval instead, and the reconnect itself
  triggers a look (docs/design.md "Wake-ups and scheduling": an idle worker costs nothing);
- each claimed notification is delivered by one of up to --concurrency long-lived tasks
  (`deliveries`), in the order claimed, with the worker's own deadline around the provider's
  (the provider's timeout fires first and says what happened; the deadline catches a provider
  that hangs anyway). No database connection or lock is held while a provider is called;
- the completer writes results as they arrive, as many as have accumulated per statement (status,
  webhook event and rate-limit slot together), so under load one round trip records hundreds;
  a result leaves memory only once its statement committed;
- housekeeping recovers expired leases and expires overdue notifications when the first lease
  runs out or the first notification expires (its own timer), and prunes old slots;
- the webhook relay (`--webhook-dispatch on`) relays the outbox, woken by the NOTIFY of every
  statement that writes events (whichever process runs it, on the listener's connection), by
  this worker's own results, and by its events' next due time;
- retention keeps the delivery log's partitions: the coming days', and none past --retention;
- the heartbeat says which lanes this worker serves, every 15 s, until it stops claiming (a
  notification no live worker serves waits `NoWorker`: services/waiting.py).

On SIGTERM the claimer stops, deliveries in flight get --shutdown-grace-seconds to finish, and
what is still unfinished is handed back without using an attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from notify_queue import tracing
from notify_queue.errors import DatabaseUnavailable
from notify_queue.models import (
    Channel,
    ClaimedNotification,
    Completion,
    DeliveryResult,
    Outcome,
    Priority,
    Status,
    Wakeup,
)
from notify_queue.services.delivery import DeliveryService
from notify_queue.services.retention import DeliveryLogKeeper
from notify_queue.services.waiting import WorkerHeartbeat
from notify_queue.worker.deliveries import Deliveries
from notify_queue.worker.dispatcher import WebhookDispatcher
from notify_queue.worker.metrics import DELIVERIES, DUE_TO_SENT, STALE_RESULTS
from notify_queue.worker.routing import Router
from notify_queue.worker.supervision import Health, supervise
from notify_queue.worker.waiting import wait_any

log = logging.getLogger(__name__)

_COMPLETE_CHUNK = 1000
_RETRY_DB_SECONDS = 1.0
RETENTION_INTERVAL_SECONDS = 3600.0
# While the LISTEN connection is up, hints are not lost; the worker still looks this often for
# work nobody announced (an API whose NOTIFY failed after its commit, rows written by SQL). An
# idle worker's whole cost is about seven statements per look (docs/design.md).
SAFETY_LOOK_SECONDS = 30.0
# Old rate-limit slots count for nothing (the window ignores them): pruning is tidying, done
# once a minute while this worker claims and hourly otherwise.
_PRUNE_BUSY_SECONDS = 60.0
_PRUNE_IDLE_SECONDS = 3600.0


class Worker:
    def __init__(
        self,
        service: DeliveryService,
        router: Router,
        dispatcher: WebhookDispatcher | None,
        *,
        concurrency: int,
        batch_size: int,
        poll_interval: float,
        shutdown_grace_seconds: float,
        health: Health | None = None,
        delivery_log: DeliveryLogKeeper | None = None,
        lease_seconds: float | None = None,
        safety_look_seconds: float = SAFETY_LOOK_SECONDS,
        heartbeat: WorkerHeartbeat | None = None,
    ) -> None:
        self._service = service
        self._heartbeat = heartbeat
        self._delivery_log = delivery_log
        self._router = router
        self._dispatcher = dispatcher
        self._batch_size = batch_size
        self._poll_interval = poll_interval
        # Never below --poll-interval: a larger poll interval asks for fewer looks, not more.
        self._safety_look = max(safety_look_seconds, poll_interval)
        # Housekeeping must see another worker's lease before it runs out: a lease lasts
        # --lease-seconds, so reading the next lease end at least that often is always in time.
        self._housekeeping_look = min(self._safety_look, lease_seconds or self._safety_look)
        self._listening = False  # the LISTEN connection is up: hints arrive
        self._housekeeping_wake = asyncio.Event()
        self._claimed_since_prune = False
        self._grace = shutdown_grace_seconds
        self.health = health or Health()
        self._deliveries = Deliveries(concurrency, self._deliver)
        self._results: list[tuple[ClaimedNotification, DeliveryResult]] = []
        self._results_ready = asyncio.Event()
        self._flush_lock = asyncio.Lock()  # the completer and the shutdown drain both flush
        self._wake = asyncio.Event()
        self._claiming_stopped = asyncio.Event()
        self._stop = asyncio.Event()
        # Tracing on only: the claim that took the deliveries starting now (their spans link
        # to it), and when each result arrived with its delivery span (its completion span).
        self._claim_link: object = None
        self._arrived: dict[uuid.UUID, tuple[int, str | None]] = {}

    # -- lifecycle -------------------------------------------------------------------------

    def stop(self) -> None:
        """Begin a graceful shutdown (SIGTERM, Ctrl-C)."""
        self._claiming_stopped.set()

    async def run(self) -> None:
        tasks: dict[str, Callable[[], Awaitable[None]]] = {
            "claim": self._claim_forever,
            "listen": self._listen,
            "complete": self._complete_forever,
            "housekeeping": self._housekeeping_forever,
        }
        if self._delivery_log is not None:
            keeper = self._delivery_log
            tasks["retention"] = lambda: self._retention_forever(keeper)
        if self._dispatcher is not None:
            dispatcher = self._dispatcher
            tasks["webhooks"] = lambda: dispatcher.run(self._stop)
        if self._heartbeat is not None:
            heartbeat = self._heartbeat
            tasks["heartbeat"] = lambda: heartbeat.run(self._claiming_stopped)
        # The claimer, and the heartbeat that says which lanes this worker claims, stop first.
        first = ("claim", "heartbeat")
        supervised = {
            name: asyncio.create_task(
                supervise(
                    name,
                    run,
                    self.health,
                    stop=self._claiming_stopped if name in first else self._stop,
                ),
                name=name,
            )
            for name, run in tasks.items()
        }
        try:
            await supervised["claim"]
            await self._drain()
        finally:
            self._claiming_stopped.set()
            self._stop.set()
            self._results_ready.set()
            for task in supervised.values():
                task.cancel()
            for task in supervised.values():
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _drain(self) -> None:
        """Let deliveries in flight finish within the grace period; hand the rest back."""
        if self._deliveries:
            log.info(
                "shutting down: waiting up to %.0fs for %d deliveries",
                self._grace,
                len(self._deliveries),
            )
            await self._deliveries.settle(self._grace)
        unfinished = await self._deliveries.stop()
        await self._flush_results()
        if unfinished:
            released = await self._service.release(unfinished)
            log.info("handed back %d unfinished notifications without using an attempt", released)

    # -- claiming ---------------------------------------------------------------------------

    async def _claim_forever(self) -> None:
        while not self._claiming_stopped.is_set():
            if not self.health.is_healthy("complete"):
                # Results cannot be recorded right now: claiming more would only pile up work
                # whose leases run out unrecorded. Deliveries in flight still finish.
                await wait_any(self._claiming_stopped, timeout=self._poll_interval)
                continue
            free = self._deliveries.free
            if free <= 0:
                self._deliveries.slot_free.clear()
                await wait_any(
                    self._deliveries.slot_free, self._claiming_stopped, timeout=self._poll_interval
                )
                continue
            limit = min(self._batch_size, free)
            try:
                with tracing.span("notify_queue.claim", root=True) as span:
                    await self._router.circuits.refresh()
                    batch = await self._service.claim(limit, chain_heads=self._router.chain_heads)
                    if span is not None:
                        span.set_attribute(tracing.BATCH_SIZE, len(batch.claimed))
                        self._claim_link = tracing.link_to(tracing.traceparent_of(span))
            except DatabaseUnavailable as exc:
                log.warning("claim failed: %s; retrying", exc)
                await wait_any(self._claiming_stopped, timeout=_RETRY_DB_SECONDS)
                continue
            for channel in batch.rate_limited:
                DELIVERIES.labels(channel.value, Outcome.RATE_LIMITED.value, "").inc()
            self.health.ok("claim")
            self._deliveries.start(batch.claimed)
            if batch.claimed:
                self._claimed_since_prune = True
            if batch.screened and self._dispatcher is not None:
                self._dispatcher.poke()  # a suppressed or expired row may have its event
            if len(batch.claimed) + len(batch.rate_limited) >= limit:
                continue  # more may be due right now
            # Cleared before the look: a wake-up for a row committed after it wakes the next wait.
            self._wake.clear()
            try:
                wait = await self._service.seconds_until_due(ceiling=self._look_ceiling())
            except DatabaseUnavailable:
                wait = _RETRY_DB_SECONDS
            if wait > 0:
                await wait_any(self._wake, self._claiming_stopped, timeout=wait)

    def _look_ceiling(self, ceiling: float | None = None) -> float:
        """The longest an idle task sleeps without a look: --poll-interval while hints can be
        lost (no LISTEN connection), else the safety look (or `ceiling`)."""
        if not self._listening:
            return self._poll_interval
        return self._safety_look if ceiling is None else ceiling

    async def _listen(self) -> None:
        # The listener reconnects by itself; a (re)start that gets here is a working listener.
        self.health.ok("listen")
        try:
            wakeups = self._service.wakeups(
                self._stop,
                webhook_events=self._dispatcher is not None,
                on_state=self._listen_state,
            )
            async for wakeup in wakeups:
                # Events written by any process (an API's create, SQL, another worker) reach
                # this relay at once (docs/design.md "Wake-ups and scheduling"); the
                # (re)connect itself wakes everyone.
                if wakeup is not Wakeup.WORK and self._dispatcher is not None:
                    self._dispatcher.poke()
                if wakeup is not Wakeup.WEBHOOK_EVENTS:
                    self._wake.set()
                    self._housekeeping_wake.set()
        finally:
            self._listen_state(False)

    def _listen_state(self, listening: bool) -> None:
        if self._listening and not listening:
            # Hints can be lost from now on: the sleepers start polling at --poll-interval.
            self._wake.set()
            self._housekeeping_wake.set()
        self._listening = listening

    # -- delivering -------------------------------------------------------------------------

    async def _deliver(self, claimed: ClaimedNotification) -> None:
        try:
            if tracing.enabled():
                result = await self._deliver_traced(claimed)
            else:
                result = await self._router.deliver(claimed)
            if result.outcome is Outcome.SENT and claimed.due_at is not None:
                _observe_due_to_sent(claimed)
            self._results.append((claimed, result))
            self._results_ready.set()
        except Exception:
            # `Router.deliver` turns every provider error into a result; reaching this is a bug
            # of ours. The lease runs out and housekeeping hands the notification back.
            log.exception("delivery of %s failed", claimed.id)

    async def _deliver_traced(self, claimed: ClaimedNotification) -> DeliveryResult:
        """The delivery as a span continuing the creator's trace (the stored traceparent),
        linked to the claim that took it and, for a digest, to each of its items' traces."""
        with tracing.span(
            "notify_queue.deliver",
            parent=claimed.traceparent,
            root=claimed.traceparent is None,
            kind="consumer",
            links=(self._claim_link, *claimed.linked_traceparents),
            attributes={
                tracing.NOTIFICATION_ID: str(claimed.id),
                tracing.CHANNEL: claimed.channel.value,
                tracing.ATTEMPT: claimed.attempt_count,
                tracing.PRIORITY: claimed.priority.value,
            },
        ) as span:
            result = await self._router.deliver(claimed)
            if span is not None and span.is_recording():  # not sampled: no completion span
                span.set_attribute(tracing.OUTCOME, result.outcome.value)
                if result.provider is not None:
                    span.set_attribute(tracing.PROVIDER, result.provider)
                self._arrived[claimed.id] = (time.time_ns(), tracing.traceparent_of(span))
        return result

    # -- completing -------------------------------------------------------------------------

    async def _complete_forever(self) -> None:
        while not self._stop.is_set():
            # Flush first: after a restart, results of the failed round are still waiting.
            self._results_ready.clear()
            await self._flush_results()
            # A round that ran through (even with nothing to write) is a working completer; the
            # claimer waits for this after a failure, so it must not need new results first.
            self.health.ok("complete")
            await self._results_ready.wait()

    async def _flush_results(self) -> None:
        async with self._flush_lock:
            await self._flush_locked()

    async def _flush_locked(self) -> None:
        while self._results:
            # The chunk leaves the buffer only after its statement committed: an unexpected error
            # (the supervisor restarts this task) loses no result.
            chunk = self._results[:_COMPLETE_CHUNK]
            try:
                with tracing.span("notify_queue.complete", root=True) as span:
                    if span is not None:
                        span.set_attribute(tracing.BATCH_SIZE, len(chunk))
                    completions, recorded = await self._service.complete(chunk)
            except DatabaseUnavailable as exc:
                # Results are kept and written once the database is back; the leases are
                # long enough that nobody else takes these notifications meanwhile.
                log.warning("recording %d results failed: %s; retrying", len(chunk), exc)
                await asyncio.sleep(_RETRY_DB_SECONDS)
                continue
            del self._results[: len(chunk)]
            if self._arrived:
                self._trace_completions(chunk, completions, recorded.accepted)
            await self._router.circuits.flush()
            stale = len(chunk) - len(recorded.accepted)
            if stale:
                STALE_RESULTS.inc(stale)
                log.warning("%d results arrived after their claim expired; dropped", stale)
            if self._dispatcher is not None and recorded.events_possible:
                self._dispatcher.poke()
            if any(c.status is Status.PENDING for c in completions):
                # A retry later: the claimer's timer must know its new due time (no other
                # process announces it).
                self._wake.set()

    def _trace_completions(
        self,
        chunk: list[tuple[ClaimedNotification, DeliveryResult]],
        completions: Sequence[Completion],
        accepted: set[uuid.UUID],
    ) -> None:
        """Each result's wait for its statement and the statement, as a span in its own
        notification's trace (the statement itself is one span of the batch, `complete`)."""
        status = {c.id: c.status.value for c in completions}
        for claimed, result in chunk:
            arrived = self._arrived.pop(claimed.id, None)
            if arrived is None:
                continue
            started_ns, delivery = arrived
            tracing.record_span(
                "notify_queue.completion",
                parent=delivery,
                start_time_ns=started_ns,
                attributes={
                    tracing.NOTIFICATION_ID: str(claimed.id),
                    tracing.OUTCOME: result.outcome.value,
                    # A result that came after its lease ran out is dropped: "stale".
                    tracing.STATUS: status[claimed.id] if claimed.id in accepted else "stale",
                },
            )

    # -- housekeeping -----------------------------------------------------------------------

    async def _housekeeping_forever(self) -> None:
        """Sweep leases and expiry when the first of them is due, not on a clock: read when
        (one statement), sleep until then or until a wake-up (a new row may expire sooner), and
        never more often than --poll-interval (under load, wake-ups come many times a second)."""
        last_prune = time.monotonic()
        while not self._stop.is_set():
            self._housekeeping_wake.clear()
            round_started = time.monotonic()
            wait = self._poll_interval
            try:
                due_in = await self._service.seconds_until_housekeeping(
                    ceiling=self._look_ceiling(self._housekeeping_look)
                )
                if due_in <= 0:
                    await self._sweep()
                else:
                    wait = due_in
                since_prune = time.monotonic() - last_prune
                if since_prune > _PRUNE_IDLE_SECONDS or (
                    self._claimed_since_prune and since_prune > _PRUNE_BUSY_SECONDS
                ):
                    self._claimed_since_prune = False
                    await self._service.prune_rate_windows()
                    last_prune = time.monotonic()
                self.health.ok("housekeeping")
            except DatabaseUnavailable as exc:
                log.warning("housekeeping skipped: %s", exc)
            await wait_any(self._housekeeping_wake, self._stop, timeout=wait)
            # At most one round per poll interval, however often it is woken.
            rest = round_started + self._poll_interval - time.monotonic()
            if rest > 0:
                await wait_any(self._stop, timeout=rest)

    async def _sweep(self) -> None:
        recovered, dead, expired = await self._service.housekeeping()
        if recovered or expired:
            log.info(
                "recovered %d expired leases (%d dead-lettered), expired %d",
                recovered,
                dead,
                expired,
            )
            self._wake.set()
            if self._dispatcher is not None:
                self._dispatcher.poke()  # dead-lettered and expired rows have their events

    async def _retention_forever(self, keeper: DeliveryLogKeeper) -> None:
        # At start, then hourly: partitions are daily and made a week ahead, so an hour is early
        # enough for both creating and dropping.
        while not self._stop.is_set():
            try:
                await keeper.maintain()
                self.health.ok("retention")
            except DatabaseUnavailable as exc:
                log.warning("delivery log retention skipped: %s", exc)
            await wait_any(self._stop, timeout=RETENTION_INTERVAL_SECONDS)


# Label lookups cost more than the observation: one child per (channel, priority), made once.
_DUE_TO_SENT_CHILDREN: dict[tuple[Channel, Priority], Any] = {}


def _observe_due_to_sent(claimed: ClaimedNotification) -> None:
    assert claimed.due_at is not None
    key = (claimed.channel, claimed.priority)  # members: hashed as their text, in C
    child = _DUE_TO_SENT_CHILDREN.get(key)
    if child is None:
        child = _DUE_TO_SENT_CHILDREN[key] = DUE_TO_SENT.labels(*map(str, key))
    child.observe(max((datetime.now(UTC) - claimed.due_at).total_seconds(), 0.0))
