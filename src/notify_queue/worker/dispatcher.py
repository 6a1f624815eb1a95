"""Webhook dispatch: the outbox's relay, in a worker (`--webhook-dispatch on`) or alone (`relay`).

Events are claimed only as fast as POSTs can start: a claim takes at most as many events as there
are free POST slots, so every claimed event is POSTed at once and its lease (long enough for one
POST and its record) never runs out while it waits behind its neighbours. Under load a claim waits
until a quarter of the slots are free, so each claim statement takes a batch, not the one or two
slots the last POSTs freed (a claim costs about the same for 1 row as for 64). Each POST is a task
of its own; its result joins a buffer that the recorder writes as results arrive, many per
statement under load, so one slow receiver delays only its own events. At least once: an event whose
dispatcher dies mid-POST is taken again when its lease ends, with the same eventId, so receivers
de-duplicate on it. At most `--webhook-max-attempts` POSTs: the claim counts the attempt, and an
event whose last attempt's result never came ends failed when its lease ends (webhook_claim_due).

Trust: the `--webhook-url` configured by whoever runs the system is reached wherever it is;
every other URL (a notification's `webhookUrl`, a policy's webhook: chosen by API clients and
namespace users) goes through the outbound guard and its `--outbound-allow` list.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from urllib.parse import urlsplit

from notify_queue import tracing
from notify_queue.errors import DatabaseUnavailable
from notify_queue.models import WebhookEvent, WebhookResult
from notify_queue.providers.webhooks import WebhookSender
from notify_queue.repositories.webhooks import WebhookRepository
from notify_queue.services.webhooks import decide_webhook_result
from notify_queue.settings import RelaySettings
from notify_queue.worker.metrics import WEBHOOK_POSTS
from notify_queue.worker.supervision import Health
from notify_queue.worker.waiting import wait_any

log = logging.getLogger(__name__)

# POSTs in flight per process, and so the most events one claim takes. Each is a kept-alive
# connection to its receiver (HTTP/1.1 has one request at a time per connection), so this is also
# how many connections one relay may hold to a single receiver.
_CONCURRENCY = 256
# Under load, a claim waits for this share of the slots to be free (see the module docstring).
_CLAIM_BATCH_SHARE = 0.25
_RETRY_DB_SECONDS = 1.0
_HEALTH_NAME = "webhooks"
# Bound once: looking a label up costs more than the increment, per event.
_POSTS_DELIVERED = WEBHOOK_POSTS.labels("delivered")
_POSTS_ERROR = WEBHOOK_POSTS.labels("error")


class WebhookDispatcher:
    def __init__(
        self,
        settings: RelaySettings,
        repository: WebhookRepository,
        *,
        guarded: WebhookSender,
        trusted: WebhookSender,
        health: Health | None = None,
        concurrency: int = _CONCURRENCY,
        look_seconds: float | None = None,
    ) -> None:
        self._settings = settings
        self._repository = repository
        self._guarded = guarded
        self._trusted = trusted
        self._health = health or Health()
        self._concurrency = concurrency
        # The longest an idle relay sleeps without a look. New events `poke` it: the NOTIFY of
        # the statement that wrote them, heard on its process's LISTEN connection (not on Citus:
        # docs/design.md "Wake-ups and scheduling"), and inside a worker that worker's own
        # results. This is the safety look for a NOTIFY lost with its connection.
        self._look_seconds = max(look_seconds or settings.poll_interval, settings.poll_interval)
        self._claim_batch = max(1, int(concurrency * _CLAIM_BATCH_SHARE))
        self._wake = asyncio.Event()
        self._slot_free = asyncio.Event()
        self._results_ready = asyncio.Event()
        # Kept on the instance, not in `run`: when the supervisor restarts `run` after an error,
        # POSTs in flight carry on and their results are still recorded.
        self._in_flight: set[asyncio.Task[None]] = set()
        self._results: list[WebhookResult] = []
        self._record_lock = asyncio.Lock()

    def poke(self) -> None:
        """New events were written: look now instead of at the next look."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and POST until `stop`; then cancel what is in flight and record what finished."""
        recorder = asyncio.create_task(self._record_forever(stop), name="webhook-recorder")
        try:
            await self._claim_forever(stop, recorder)
        finally:
            if stop.is_set():
                for task in list(self._in_flight):
                    task.cancel()
                await asyncio.gather(*self._in_flight, return_exceptions=True)
            recorder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await recorder
            if stop.is_set():
                with contextlib.suppress(DatabaseUnavailable):
                    await self._record()

    async def _claim_forever(self, stop: asyncio.Event, recorder: asyncio.Task[None]) -> None:
        s = self._settings
        # One POST (bounded by --webhook-timeout) plus the time to record it, with room to spare.
        lease = s.webhook_timeout * 2 + 5
        while not stop.is_set():
            if recorder.done():
                recorder.result()  # the recorder failed: raise it here for the supervisor
            free = self._concurrency - len(self._in_flight)
            if free <= 0 or (self._in_flight and free < self._claim_batch):
                self._slot_free.clear()
                await wait_any(self._slot_free, stop, timeout=s.poll_interval)
                continue
            # Cleared before the claim: a poke for an event committed after its snapshot wakes
            # the wait below instead of being lost with a clear after it.
            self._wake.clear()
            try:
                events = await self._repository.webhook_events_claim(
                    limit=free,
                    lease_seconds=lease,
                    max_attempts=s.webhook_max_attempts,
                    default_url=s.webhook_url,
                    default_secrets=s.webhook_secrets,
                )
                traces = await self._traceparents(events) if tracing.enabled() else {}
                for event in events:
                    task = asyncio.create_task(self._post(event, traces.get(event.notification_id)))
                    self._in_flight.add(task)
                    task.add_done_callback(self._post_done)
                self._health.ok(_HEALTH_NAME)
                if len(events) == free:
                    continue
                next_due, now = await self._repository.webhook_next_due_at()
                wait = self._look_seconds
                if next_due is not None:
                    wait = min(max((next_due - now).total_seconds(), 0.0), wait)
            except DatabaseUnavailable as exc:
                log.warning("webhook dispatch paused: %s", exc)
                wait = s.poll_interval
            await wait_any(self._wake, stop, timeout=wait)

    def _post_done(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._slot_free.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("webhook POST task failed", exc_info=task.exception())

    async def _traceparents(self, events: list[WebhookEvent]) -> dict[uuid.UUID, str]:
        """The notifications' trace contexts (tracing on only); none when they cannot be read:
        the events go out all the same, each in a trace of its own."""
        if not events:
            return {}
        try:
            return await self._repository.webhook_traceparents(
                notification_ids=[e.notification_id for e in events]
            )
        except DatabaseUnavailable as exc:
            log.warning("reading the trace context of webhook events failed: %s", exc)
            return {}

    async def _post(self, event: WebhookEvent, traceparent: str | None = None) -> None:
        with tracing.span(
            "notify_queue.webhook.relay",
            parent=traceparent,
            root=traceparent is None,
            kind="client",
            attributes={
                tracing.NOTIFICATION_ID: str(event.notification_id),
                tracing.WEBHOOK_EVENT_ID: str(event.id),
                tracing.ATTEMPT: event.attempts,
            },
        ) as span:
            delivered = await self._post_event(event, tracing.traceparent_of(span))
            if span is not None:
                span.set_attribute(tracing.OUTCOME, "delivered" if delivered else "error")

    async def _post_event(self, event: WebhookEvent, traceparent: str | None) -> bool:
        sender = self._trusted if event.url == self._settings.webhook_url else self._guarded
        try:
            error = await sender.post(
                event_id=str(event.id),
                url=event.url,
                payload=event.payload,
                secrets=event.secrets,
                trace_headers=tracing.propagation_headers(traceparent),
            )
        except Exception as exc:
            # A fault of ours, not an answer: still a failed attempt, recorded now rather than
            # left to the lease (the claim counted it either way).
            log.exception("webhook %s: POST failed unexpectedly", event.id)
            error = f"internal error: {type(exc).__name__}"
        s = self._settings
        result = decide_webhook_result(
            event,
            error,
            max_attempts=s.webhook_max_attempts,
            backoff_base_seconds=s.webhook_backoff_base,
            backoff_max_seconds=s.webhook_backoff_max,
        )
        (_POSTS_DELIVERED if result.delivered else _POSTS_ERROR).inc()
        if result.error is not None:
            log.info(
                "webhook %s to %s failed (attempt %d): %s",
                event.id,
                _origin(event.url),
                event.attempts,
                result.error,
            )
        self._results.append(result)
        self._results_ready.set()
        return result.delivered

    async def _record_forever(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            # Record first: after a restart, results of the failed round are still waiting.
            self._results_ready.clear()
            try:
                retried = await self._record()
            except DatabaseUnavailable as exc:
                log.warning("recording webhook results failed: %s; retrying", exc)
                await wait_any(stop, timeout=_RETRY_DB_SECONDS)
                continue
            if retried:
                # The claimer chose its sleep while these events were leased (due at the lease's
                # end); their retries are due sooner, so it must look again now.
                self._wake.set()
            await self._results_ready.wait()

    async def _record(self) -> bool:
        """Write the results that have arrived; each leaves the buffer once its statement
        committed. True when one of them scheduled a retry."""
        retried = False
        async with self._record_lock:
            while self._results:
                chunk = self._results[:1000]
                await self._repository.webhook_results_record(results=chunk)
                del self._results[: len(chunk)]
                retried = retried or any(r.retry_in_seconds is not None for r in chunk)
        return retried


def _origin(url: str) -> str:
    """Where an event went, for the log: scheme, host and port only. A webhook URL can carry a
    credential in its user info, path or query (many services put the token in the path)."""
    parts = urlsplit(url)
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{parts.hostname or '?'}{port}"
