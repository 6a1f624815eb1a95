"""Posting webhook events, signed the Standard Webhooks way (docs/webhooks.md).

Each POST carries `webhook-id` (the event id, the same on every attempt so receivers can drop
repeats), `webhook-timestamp` (unix seconds, fresh per attempt so receivers can reject replays)
and, when secrets are configured, `webhook-signature` with one `v1,<base64>` entry per secret.
Signing with every secret at once is what makes rotation painless: during the overlap a receiver
that knows either the old or the new secret accepts the event.

The signature comes from the `standardwebhooks` reference library, so the bytes we sign are
exactly the bytes its `verify` checks; we do not hand-roll the HMAC. The payload is sent as the
exact string that was signed. Redirects are not followed: a signed event goes to the configured
URL or not at all, and the 3xx is reported for the retry schedule. The POST goes through the
relay's own HTTP client (`posting`): for client-supplied URLs a `guarded_poster`, so private and
metadata addresses are refused before anything is sent; the operator's own `--webhook-url`
through a `trusted_poster`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import lru_cache

from standardwebhooks.webhooks import EmptyWebhookSecretError, Webhook

from notify_queue.providers.outbound import OutboundRefused, describe_failed_response
from notify_queue.providers.posting import Poster, PostFailed


@lru_cache(maxsize=64)
def _signer(secret: str) -> Webhook:
    # Decoding the base64 secret once per secret, not once per event.
    return Webhook(secret)


def signature_header(
    *, event_id: str, timestamp_seconds: int, payload: str, secrets: tuple[str, ...]
) -> str:
    """The `webhook-signature` value: `v1,<sig>` per secret, space-separated."""
    signed_at = datetime.fromtimestamp(timestamp_seconds, tz=UTC)
    return " ".join(_signer(secret).sign(event_id, signed_at, payload) for secret in secrets)


class WebhookSender:
    def __init__(self, poster: Poster, timeout_seconds: float) -> None:
        self._poster = poster
        self._timeout_seconds = timeout_seconds

    async def post(
        self,
        *,
        event_id: str,
        url: str,
        payload: str,
        secrets: tuple[str, ...],
        trace_headers: Mapping[str, str] | None = None,
    ) -> str | None:
        """POST one event; None when the receiver answered 2xx, else why it was not delivered.
        `trace_headers` (`traceparent`, notify_queue.tracing) travel with it, unsigned: the
        signature covers the id, the timestamp and the body."""
        timestamp_seconds = int(time.time())
        headers = {
            **(trace_headers or {}),
            "Content-Type": "application/json",
            "webhook-id": event_id,
            "webhook-timestamp": str(timestamp_seconds),
        }
        if secrets:
            try:
                headers["webhook-signature"] = signature_header(
                    event_id=event_id,
                    timestamp_seconds=timestamp_seconds,
                    payload=payload,
                    secrets=secrets,
                )
            except (ValueError, EmptyWebhookSecretError) as exc:
                # binascii.Error (bad base64) is a ValueError. Never send such an event unsigned.
                return f"invalid webhook secret: {exc}"
        try:
            answer = await self._poster.post(url, payload.encode(), headers)
        except (OutboundRefused, PostFailed) as exc:
            return str(exc)
        except TimeoutError:
            return f"timed out after {self._timeout_seconds:g}s"
        if 200 <= answer.status < 300:
            return None
        return describe_failed_response(answer.status, answer.body)
