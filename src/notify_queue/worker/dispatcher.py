"""Webhook dispatch: the outbox's relay, run inside every worker process.

Claims due events in batches (SKIP LOCKED, with a lease), POSTs them concurrently and records the
batch's results in one statement. At least once: an event whose dispatcher dies mid-POST is taken
again when its lease ends, with the same eventId, so receivers de-duplicate on it.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit

from notify_queue.errors import DatabaseUnavailable
from notify_queue.models import WebhookEvent, WebhookResult
from notify_queue.providers.webhooks import WebhookSender
from notify_queue.repositories.webhooks import WebhookRepository
from notify_queue.services.webhooks import decide_webhook_result
from notify_queue.settings import Settings
from notify_queue.worker.metrics import WEBHOOK_POSTS
from notify_queue.worker.waiting import wait_any

log = logging.getLogger(__name__)

# Events claimed per statement and POSTs in flight per process. A claim and a record cost one
# round trip each, so a large batch amortises them; 128 POSTs in flight keep a receiver's
# keep-alive connections busy without opening more than aiohttp's default pool of 100 per host.
_BATCH = 500
_CONCURRENCY = 128


class WebhookDispatcher:
    def __init__(
        self, settings: Settings, repository: WebhookRepository, sender: WebhookSender
    ) -> None:
        self._settings = settings
        self._repository = repository
        self._sender = sender
        self._wake = asyncio.Event()
        self._limit = asyncio.Semaphore(_CONCURRENCY)

    def poke(self) -> None:
        """New events were written by this process: look now instead of at the next poll."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        s = self._settings
        lease = s.webhook_timeout * 2 + 5
        while not stop.is_set():
            try:
                events = await self._repository.webhook_events_claim(
                    limit=_BATCH, lease_seconds=lease, default_secrets=s.webhook_secrets
                )
                if events:
                    results = await asyncio.gather(*(self._post(e) for e in events))
                    await self._repository.webhook_results_record(results=results)
                    if len(events) == _BATCH:
                        continue
                next_due, now = await self._repository.webhook_next_due_at()
                wait = s.poll_interval
                if next_due is not None:
                    wait = min(max((next_due - now).total_seconds(), 0.0), wait)
            except DatabaseUnavailable as exc:
                log.warning("webhook dispatch paused: %s", exc)
                wait = s.poll_interval
            await wait_any(self._wake, stop, timeout=wait)
            self._wake.clear()

    async def _post(self, event: WebhookEvent) -> WebhookResult:
        async with self._limit:
            error = await self._sender.post(
                event_id=str(event.id), url=event.url, payload=event.payload, secrets=event.secrets
            )
        WEBHOOK_POSTS.labels("delivered" if error is None else "error").inc()
        if error is not None:
            log.info(
                "webhook %s to %s failed (attempt %d): %s",
                event.id,
                _origin(event.url),
                event.attempts,
                error,
            )
        s = self._settings
        return decide_webhook_result(
            event,
            error,
            max_attempts=s.webhook_max_attempts,
            backoff_base_seconds=s.webhook_backoff_base,
            backoff_max_seconds=s.webhook_backoff_max,
        )


def _origin(url: str) -> str:
    """Where an event went, for the log: scheme, host and port only. A webhook URL can carry a
    credential in its user info, path or query (many services put the token in the path)."""
    parts = urlsplit(url)
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{parts.hostname or '?'}{port}"
