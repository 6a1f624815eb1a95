"""The seam between the worker and the outside world that delivers notifications.

A provider gets one `DeliveryRequest` per attempt and answers with a `DeliveryResult`; it never
raises for a delivery problem (timeouts and connection errors are temporary failures), so the
worker's rules see every outcome the same way. The notification id is the idempotency key on
every attempt: a retry after a crash must not deliver twice at a provider that honours it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from notify_queue.models import Channel, DeliveryResult, Priority


@dataclass(frozen=True, slots=True)
class DeliveryRequest:
    id: uuid.UUID  # also the idempotency key
    channel: Channel
    recipient: str
    subject: str | None
    body: str
    metadata: dict[str, Any] = field(default_factory=dict)
    priority: Priority = Priority.NORMAL  # an incident's severity (pagerduty, opsgenie)
    # Extra email headers (List-Unsubscribe, docs/receipts.md): SMTP writes them into the
    # message, the HTTP provider passes them on as `headers`.
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def idempotency_key(self) -> str:
        return str(self.id)


class Provider(Protocol):
    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        """Attempt one delivery; return its outcome, never raise for a delivery failure."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...
