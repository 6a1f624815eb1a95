"""The `webhook` provider type: a JSON POST to the URL a destination names, for any system with an
HTTP endpoint (not to be confused with `webhooks.py`, the status events of the outbox).

The body is the notification's body when that is JSON (a template's `webhook` part renders it),
else `{"subject", "body", "id", "metadata"}`. With `secretFrom` each POST is signed the Standard
Webhooks way, with the same code as the outbox's events (`webhooks.signature_header`):
`webhook-id` is the notification id on every attempt, so a receiver can drop a repeat.
2xx is SENT; 408, 429 and 5xx retry (429 and 503 with `Retry-After`); anything else is permanent.
The URLs come from the providers file; a recipient is only ever a destination name, so a client
cannot make a worker POST anywhere the operator did not list.
"""

from __future__ import annotations

import json
import time

from standardwebhooks.webhooks import EmptyWebhookSecretError

from notify_queue.models import DeliveryResult, Outcome
from notify_queue.providers.base import DeliveryRequest
from notify_queue.providers.vendor import JsonPoster, dumps, unmapped
from notify_queue.providers.webhooks import signature_header


class WebhookProvider:
    def __init__(
        self,
        name: str,
        *,
        destinations: dict[str, str],
        secret: str | None,
        poster: JsonPoster,
    ) -> None:
        self._name = name
        self._destinations = destinations
        self._secrets = (secret,) if secret else ()
        self._poster = poster

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        url = self._destinations.get(request.recipient)
        if url is None:
            return unmapped(self._name, request.recipient)
        payload = webhook_body(request)
        timestamp_seconds = int(time.time())
        headers = {
            "webhook-id": request.idempotency_key,
            "webhook-timestamp": str(timestamp_seconds),
        }
        if self._secrets:
            try:
                headers["webhook-signature"] = signature_header(
                    event_id=request.idempotency_key,
                    timestamp_seconds=timestamp_seconds,
                    payload=payload,
                    secrets=self._secrets,
                )
            except (ValueError, EmptyWebhookSecretError) as exc:  # never send it unsigned
                return DeliveryResult(Outcome.PERMANENT_FAILURE, error=f"invalid secret: {exc}")
        return await self._poster.post_sent(url, payload.encode(), headers)

    async def close(self) -> None:
        """The session belongs to the caller that passed it in."""


def webhook_body(request: DeliveryRequest) -> str:
    """The POST body: the notification's body when it is a JSON object or array, else the
    envelope."""
    stripped = request.body.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            json.loads(stripped)
        except ValueError:
            pass
        else:
            return request.body
    envelope = {
        "subject": request.subject,
        "body": request.body,
        "id": request.idempotency_key,
        "metadata": request.metadata,
    }
    return dumps(envelope).decode()
