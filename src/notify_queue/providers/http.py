"""The HTTP provider (docs/http-provider.md): one JSON POST per attempt to a delivery service.

The notification id travels as `Idempotency-Key` on every attempt, so a retry after a lost
answer or a worker crash is deduplicated by the receiver. Every outcome is classified here and
nothing is raised: 2xx is SENT; 408, 425, 429, 5xx, timeouts and connection errors are worth
another try (with the receiver's `Retry-After`, which the delivery rules cap), and a refused
connection, 429 or 503 also prove nothing was sent (another provider may be tried at once);
410 says the address or push token is gone; everything else will not get better by retrying.
The provider URL is configured by whoever runs the system, so
its session (`trusted_session`) is not subject to the outbound guard: a gateway on a private
address in the cluster is the normal case.

Redirects are not followed: the configured URL is where notification content may go, and a 3xx
is reported as the permanent failure it is for a POST API. The session is borrowed, not owned,
so `close` leaves it to whoever made it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import aiohttp

from notify_queue import tracing
from notify_queue.models import DeliveryResult, Outcome
from notify_queue.providers.base import DeliveryRequest
from notify_queue.providers.outbound import (
    describe_failed_response,
    read_body_capped,
    transport_failure,
)

# Statuses that say "not now" rather than "never" (RFC 9110 and RFC 8470 for 425).
_TEMPORARY_STATUSES = frozenset({408, 425, 429})
# Temporary answers that prove the request was not acted on, so another provider may be tried at
# once without risking a duplicate (docs/providers.md, "Failover"): too many requests, unavailable.
_NOTHING_SENT_STATUSES = frozenset({429, 503})
# "Gone": the address or push token is no longer valid (docs/providers.md). Permanent.
_GONE = 410


class HttpProvider:
    def __init__(self, url: str, timeout_seconds: float, session: aiohttp.ClientSession) -> None:
        self._url = url
        self._timeout_seconds = timeout_seconds
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._session = session

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        document: dict[str, object] = {
            "id": str(request.id),
            "channel": request.channel.value,
            "recipient": request.recipient,
            "subject": request.subject,
            "body": request.body,
            "metadata": request.metadata,
        }
        if request.headers:
            # Email headers the vendor's API should set (List-Unsubscribe, docs/receipts.md).
            document["headers"] = request.headers
        payload = json.dumps(document, ensure_ascii=False).encode()
        headers = {
            **tracing.aiohttp_headers(),
            "Content-Type": "application/json",
            "Idempotency-Key": request.idempotency_key,
        }
        try:
            async with self._session.post(
                self._url,
                data=payload,
                headers=headers,
                timeout=self._timeout,
                allow_redirects=False,
            ) as response:
                body = await read_body_capped(response)
                return _classify(response.status, response.headers.get("Retry-After"), body)
        except (TimeoutError, aiohttp.ClientError) as exc:
            return transport_failure(
                exc, timeout_seconds=self._timeout_seconds, url_is="provider URL"
            )

    async def close(self) -> None:
        """The session belongs to the caller that passed it in."""


def _classify(status: int, retry_after: str | None, body: bytes) -> DeliveryResult:
    if 200 <= status < 300:
        return DeliveryResult(Outcome.SENT, provider_message_id=_message_id(body))
    error = describe_failed_response(status, body)
    if status in _TEMPORARY_STATUSES or 500 <= status < 600:
        return DeliveryResult(
            Outcome.TEMPORARY_FAILURE,
            error=error,
            retry_after_seconds=parse_retry_after(retry_after),
            nothing_sent=status in _NOTHING_SENT_STATUSES,
        )
    if status == _GONE:
        return DeliveryResult(
            Outcome.PERMANENT_FAILURE, error=f"address no longer valid: {error}", address_gone=True
        )
    return DeliveryResult(Outcome.PERMANENT_FAILURE, error=error)


def _message_id(body: bytes) -> str | None:
    """The receiver's id for the message: `messageId`, else `id`, when the body is a JSON object."""
    if not body:
        return None
    try:
        document = json.loads(body)
    except ValueError:  # not JSON (or cut off at the size cap): no id, still SENT
        return None
    if not isinstance(document, dict):
        return None
    for field in ("messageId", "id"):
        value = document.get(field)
        # bool is an int, but `"id": true` is no message id.
        if isinstance(value, str | int) and not isinstance(value, bool) and str(value):
            return str(value)
    return None


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from `Retry-After`: delay-seconds or an HTTP-date (RFC 9110 10.2.3)."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000" dates parse naive; HTTP-dates are always GMT
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
