"""PagerDuty: Events API v2 (`POST https://events.pagerduty.com/v2/enqueue`), one event per attempt.

A destination names the routing key of a service's Events API integration. The event triggers an
alert with `dedup_key` = the notification id, the same on every attempt, so PagerDuty folds a
retry after a lost answer into the alert it already has: delivery is exactly once as PagerDuty
counts alerts. `payload.summary` is the subject (else the start of the body), `severity` follows
the priority (HIGH critical, NORMAL warning, LOW info), `custom_details` holds the body and the
metadata. 202 is SENT (the `dedup_key` echoed is the provider message id); 400 is an event
PagerDuty refuses (a bad routing key, a missing field: its `message` and `errors` in `lastError`),
permanent; 429 defers (PagerDuty sends no `Retry-After`: the usual backoff); 5xx retries.

With `resolveOnAcknowledge`, a notification that resolves an acknowledged escalation's step
(its metadata names the step, services/escalations.py) sends `event_action: resolve` with the
step's id as `dedup_key`, which closes the alert that step triggered.
"""

from __future__ import annotations

from typing import Any

from notify_queue.models import RESOLVES_METADATA, DeliveryResult, Outcome
from notify_queue.providers.base import DeliveryRequest
from notify_queue.providers.vendor import SEVERITY, Answer, JsonPoster, dumps, failed, unmapped

SUMMARY_CHARS = 1024  # PagerDuty truncates a longer summary
SOURCE = "notify-queue"


class PagerDutyProvider:
    def __init__(
        self,
        name: str,
        *,
        url: str,
        routing_keys: dict[str, str],
        resolve_on_acknowledge: bool,
        poster: JsonPoster,
    ) -> None:
        self._name = name
        self._resolves = resolve_on_acknowledge
        self._url = url
        self._routing_keys = routing_keys
        self._poster = poster

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        routing_key = self._routing_keys.get(request.recipient)
        if routing_key is None:
            return unmapped(self._name, request.recipient)
        resolves = request.metadata.get(RESOLVES_METADATA) if self._resolves else None
        event = (
            resolve_event(str(resolves), routing_key)
            if resolves is not None
            else trigger_event(request, routing_key)
        )
        answer = await self._poster.post(self._url, dumps(event))
        if isinstance(answer, DeliveryResult):
            return answer
        return _classify(answer)

    async def close(self) -> None:
        """The session belongs to the caller that passed it in."""


def trigger_event(request: DeliveryRequest, routing_key: str) -> dict[str, Any]:
    summary = request.subject or request.body
    return {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": request.idempotency_key,
        "payload": {
            "summary": summary[:SUMMARY_CHARS],
            "source": SOURCE,
            "severity": SEVERITY[request.priority],
            "custom_details": {"body": request.body, "metadata": request.metadata},
        },
    }


def resolve_event(dedup_key: str, routing_key: str) -> dict[str, Any]:
    return {"routing_key": routing_key, "event_action": "resolve", "dedup_key": dedup_key}


def _classify(answer: Answer) -> DeliveryResult:
    document = answer.json_object()
    if 200 <= answer.status < 300:
        dedup_key = document.get("dedup_key")
        return DeliveryResult(
            Outcome.SENT, provider_message_id=dedup_key if isinstance(dedup_key, str) else None
        )
    reason = None
    if document:
        message = document.get("message")
        errors = document.get("errors")
        details = "; ".join(str(e) for e in errors) if isinstance(errors, list) else ""
        reason = f"pagerduty: {message}" + (f": {details}" if details else "")
    return failed(answer, reason)
