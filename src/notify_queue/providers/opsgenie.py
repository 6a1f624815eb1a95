"""Opsgenie: the Alert API (`POST https://api.opsgenie.com/v2/alerts`, `Authorization: GenieKey`).

A destination names an Opsgenie team, the alert's responder (`responders: [{"type": "team",
"name": ...}]`). `alias` is the notification id, the same on every attempt: Opsgenie keeps one open
alert per alias, so a retry after a lost answer only counts again on the alert it has (delivery is
deduplicated). `message` is the subject (else the start of the body, 130 characters), `description`
the body, `priority` follows ours (HIGH P1, NORMAL P3, LOW P5), `details` the metadata as text.
Alert creation is asynchronous: 202 with a `requestId` (the provider message id) is SENT.
401/403 (a wrong key), 404 and 422 (a team or field it refuses) fail permanently with Opsgenie's
`message`; 429 (its `X-RateLimit-State: THROTTLED`) defers; 5xx retries.
"""

from __future__ import annotations

from typing import Any

from notify_queue.models import DeliveryResult, Outcome, Priority
from notify_queue.providers.base import DeliveryRequest
from notify_queue.providers.vendor import Answer, JsonPoster, dumps, failed, unmapped

MESSAGE_CHARS = 130
DESCRIPTION_CHARS = 15_000
SOURCE = "notify-queue"
_PRIORITY = {Priority.HIGH: "P1", Priority.NORMAL: "P3", Priority.LOW: "P5"}


class OpsgenieProvider:
    def __init__(
        self,
        name: str,
        *,
        url: str,
        api_key: str,
        teams: dict[str, str],
        poster: JsonPoster,
    ) -> None:
        self._name = name
        self._url = url
        self._authorization = f"GenieKey {api_key}"
        self._teams = teams
        self._poster = poster

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        team = self._teams.get(request.recipient)
        if team is None:
            return unmapped(self._name, request.recipient)
        answer = await self._poster.post(
            self._url, dumps(alert(request, team)), {"Authorization": self._authorization}
        )
        if isinstance(answer, DeliveryResult):
            return answer
        return _classify(answer)

    async def close(self) -> None:
        """The session belongs to the caller that passed it in."""


def alert(request: DeliveryRequest, team: str) -> dict[str, Any]:
    return {
        "message": (request.subject or request.body)[:MESSAGE_CHARS],
        "alias": request.idempotency_key,
        "description": request.body[:DESCRIPTION_CHARS],
        "responders": [{"type": "team", "name": team}],
        "priority": _PRIORITY[request.priority],
        "source": SOURCE,
        "details": {str(k): str(v) for k, v in request.metadata.items()},
    }


def _classify(answer: Answer) -> DeliveryResult:
    document = answer.json_object()
    if 200 <= answer.status < 300:
        request_id = document.get("requestId")
        return DeliveryResult(
            Outcome.SENT, provider_message_id=request_id if isinstance(request_id, str) else None
        )
    message = document.get("message")
    return failed(answer, f"opsgenie: {message}" if isinstance(message, str) else None)
