"""Webhook dispatch rules: what one POST's result means for its event.

A failing webhook never changes the notification: it only moves its own event through pending
(retried with backoff, same eventId) to delivered, or to failed after the last attempt.
"""

from __future__ import annotations

import random

from notify_queue.models import WebhookEvent, WebhookResult
from notify_queue.services.backoff import backoff_seconds


def decide_webhook_result(
    event: WebhookEvent,
    error: str | None,
    *,
    max_attempts: int,
    backoff_base_seconds: float,
    backoff_max_seconds: float,
    rng: random.Random | None = None,
) -> WebhookResult:
    if error is None:
        return WebhookResult(
            event.id, event.claim_token, delivered=True, error=None, retry_in_seconds=None
        )
    if event.attempts >= max_attempts:
        return WebhookResult(
            event.id, event.claim_token, delivered=False, error=error, retry_in_seconds=None
        )
    wait = backoff_seconds(
        event.attempts, base=backoff_base_seconds, maximum=backoff_max_seconds, rng=rng
    )
    return WebhookResult(
        event.id, event.claim_token, delivered=False, error=error, retry_in_seconds=wait
    )
