"""Slack: the Web API's `chat.postMessage`, or an incoming webhook per destination.

A destination maps to a channel id (`C0123ABC`: POST `{url}/chat.postMessage` with the bot token
as `Authorization: Bearer`) or to an incoming-webhook URL (POST there, no token). The message is
the body as text, the subject in bold above it; a body that is a JSON object with `blocks` is Block
Kit, sent as those blocks with a text fallback for notifications.

The Web API answers HTTP 200 with `{"ok": false, "error": code}` for most refusals, so the code
decides: `ratelimited` (also HTTP 429 with `Retry-After`) defers; Slack's own trouble
(`internal_error`, `fatal_error`, `service_unavailable`, `request_timeout`) retries; everything
else (`channel_not_found`, `not_in_channel`, `invalid_auth`, `is_archived`, `msg_too_long`...)
will not get better and fails permanently, the code in `lastError`. Slack has no idempotency key:
a retry after a lost answer may post twice (delivery is at least once, docs/providers.md).
"""

from __future__ import annotations

import json
from typing import Any

from notify_queue.models import DeliveryResult, Outcome
from notify_queue.providers.base import DeliveryRequest
from notify_queue.providers.http import parse_retry_after
from notify_queue.providers.vendor import Answer, JsonPoster, dumps, failed, unmapped

_TEMPORARY_ERRORS = frozenset(
    {"internal_error", "fatal_error", "service_unavailable", "request_timeout"}
)


class SlackProvider:
    def __init__(
        self,
        name: str,
        *,
        url: str,
        token: str | None,
        destinations: dict[str, str],
        poster: JsonPoster,
    ) -> None:
        self._name = name
        self._post_url = url.rstrip("/") + "/chat.postMessage"
        self._token = token
        self._destinations = destinations
        self._poster = poster

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        target = self._destinations.get(request.recipient)
        if target is None:
            return unmapped(self._name, request.recipient)
        message = chat_message(request)
        if target.startswith(("https://", "http://")):  # an incoming webhook: the URL is the key
            return await self._poster.post_sent(target, dumps(message), reason=_body_start)
        assert self._token is not None  # ProviderSpec requires tokenFrom for channel ids
        answer = await self._poster.post(
            self._post_url,
            dumps({"channel": target, **message}),
            {"Authorization": f"Bearer {self._token}"},
        )
        if isinstance(answer, DeliveryResult):
            return answer
        return _classify(answer)

    async def close(self) -> None:
        """The session belongs to the caller that passed it in."""


def chat_message(request: DeliveryRequest) -> dict[str, Any]:
    """`text`, or `blocks` with a text fallback when the body is Block Kit JSON."""
    text = f"*{request.subject}*\n{request.body}" if request.subject else request.body
    try:
        document = json.loads(request.body)
    except ValueError:
        return {"text": text}
    if isinstance(document, dict) and isinstance(document.get("blocks"), list):
        fallback = document.get("text") or request.subject or "notification"
        return {"text": str(fallback), "blocks": document["blocks"]}
    return {"text": text}


def _classify(answer: Answer) -> DeliveryResult:
    document = answer.json_object()
    if answer.status == 200 and document.get("ok") is True:
        ts = document.get("ts")
        channel = document.get("channel")
        message_id = f"{channel}/{ts}" if isinstance(ts, str) and channel else None
        return DeliveryResult(Outcome.SENT, provider_message_id=message_id)
    code = str(document.get("error") or "")
    if code == "ratelimited" or answer.status == 429:
        return DeliveryResult(
            Outcome.TEMPORARY_FAILURE,
            error=f"slack: {code or 'ratelimited'} (HTTP {answer.status})",
            retry_after_seconds=parse_retry_after(answer.retry_after),
            nothing_sent=True,
        )
    if answer.status != 200:
        return failed(answer, f"slack: {code}" if code else None)
    if code in _TEMPORARY_ERRORS:
        return DeliveryResult(Outcome.TEMPORARY_FAILURE, error=f"slack: {code}")
    return DeliveryResult(Outcome.PERMANENT_FAILURE, error=f"slack: {code or 'not ok'}")


def _body_start(answer: Answer) -> str | None:
    """An incoming webhook's refusal says why in its body (`invalid_payload`, `no_text`)."""
    return answer.body.decode("utf-8", "replace").strip()[:100] or None
