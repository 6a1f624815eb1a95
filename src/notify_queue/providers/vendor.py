"""What the vendor providers (slack, teams, webhook, pagerduty, opsgenie) share: one JSON POST
per attempt to an endpoint from the providers file, and the answers every vendor gives alike.

The endpoints and destinations come from the providers file only (the recipient is a destination
*name*, never a URL), so the session is the trusted one; a recipient the provider does not map
fails permanently, naming it, and nothing is sent. Per vendor, docs/providers.md ("Chat, webhook
and incident providers") has the request and the meaning of each answer; the common part is here:
a timeout or a broken connection is worth another try, 429 and 503 defer (with `Retry-After`) and
prove nothing was sent, other 5xx retry, and the vendor's refusals are permanent.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from notify_queue import tracing
from notify_queue.models import DeliveryResult, Outcome, Priority
from notify_queue.providers.http import parse_retry_after
from notify_queue.providers.outbound import (
    describe_failed_response,
    read_body_capped,
    transport_failure,
)

# Severity of an incident from the notification's priority (PagerDuty's words).
SEVERITY = {Priority.HIGH: "critical", Priority.NORMAL: "warning", Priority.LOW: "info"}
_NOTHING_SENT_STATUSES = frozenset({429, 503})


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    retry_after: str | None
    body: bytes

    def json_object(self) -> dict[str, Any]:
        """The body as a JSON object, else empty (not JSON, or cut off at the size cap)."""
        try:
            document = json.loads(self.body)
        except ValueError:
            return {}
        return document if isinstance(document, dict) else {}


def unmapped(provider: str, destination: str) -> DeliveryResult:
    return DeliveryResult(
        Outcome.PERMANENT_FAILURE,
        error=f"destination {destination!r} is not mapped by provider {provider}",
    )


class JsonPoster:
    """POSTs a JSON document with a provider's timeout; redirects are not followed (a 3xx is the
    permanent failure it is for these APIs)."""

    def __init__(self, session: aiohttp.ClientSession, timeout_seconds: float) -> None:
        self._session = session
        self._timeout_seconds = timeout_seconds
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)

    async def post(
        self, url: str, payload: bytes, headers: dict[str, str] | None = None
    ) -> Answer | DeliveryResult:
        """The vendor's answer, or the temporary failure that stood in for one."""
        sent = {
            **tracing.aiohttp_headers(),
            "Content-Type": "application/json; charset=utf-8",
            **(headers or {}),
        }
        try:
            async with self._session.post(
                url, data=payload, headers=sent, timeout=self._timeout, allow_redirects=False
            ) as response:
                body = await read_body_capped(response)
                return Answer(response.status, response.headers.get("Retry-After"), body)
        except (TimeoutError, aiohttp.ClientError) as exc:
            return transport_failure(exc, timeout_seconds=self._timeout_seconds, url_is="URL")

    async def post_sent(
        self,
        url: str,
        payload: bytes,
        headers: dict[str, str] | None = None,
        *,
        reason: Callable[[Answer], str | None] | None = None,
    ) -> DeliveryResult:
        """A post whose 2xx answer is the delivery: SENT, else `failed` with the answer and the
        `reason` a vendor's failed answer gives."""
        answer = await self.post(url, payload, headers)
        if isinstance(answer, DeliveryResult):
            return answer
        if 200 <= answer.status < 300:
            return DeliveryResult(Outcome.SENT)
        return failed(answer, reason(answer) if reason else None)


def dumps(document: object) -> bytes:
    return json.dumps(document, ensure_ascii=False).encode()


def failed(answer: Answer, reason: str | None = None) -> DeliveryResult:
    """A non-2xx answer's outcome: 408, 429 and 5xx are temporary (429 and 503 proving nothing
    was sent, `Retry-After` honoured); anything else is the vendor's refusal, permanent. `reason`
    (the vendor's own words, when its body has them) leads `lastError`."""
    error = describe_failed_response(answer.status, answer.body)
    if reason:
        error = f"{reason} ({error})"
    if answer.status in (408, 429) or 500 <= answer.status < 600:
        return DeliveryResult(
            Outcome.TEMPORARY_FAILURE,
            error=error,
            retry_after_seconds=parse_retry_after(answer.retry_after),
            nothing_sent=answer.status in _NOTHING_SENT_STATUSES,
        )
    return DeliveryResult(Outcome.PERMANENT_FAILURE, error=error)
