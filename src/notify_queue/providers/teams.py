"""Microsoft Teams: a Workflows (incoming) webhook per destination, the message an Adaptive Card.

POST of `{"type": "message", "attachments": [{"contentType":
"application/vnd.microsoft.card.adaptive", "content": <AdaptiveCard 1.4>}]}` to the destination's
URL: the subject as a bold heading, the body as wrapped text. A workflow answers 202 (an older
connector 200); 429 (with `Retry-After`) defers, 5xx retries, any other answer (400 a card it
refuses, 401/403/404 a workflow removed or not allowed) fails permanently. Teams has no
idempotency key: delivery is at least once (docs/providers.md).
"""

from __future__ import annotations

from typing import Any

from notify_queue.models import DeliveryResult
from notify_queue.providers.base import DeliveryRequest
from notify_queue.providers.vendor import JsonPoster, dumps, unmapped

ADAPTIVE_CARD = "application/vnd.microsoft.card.adaptive"


class TeamsProvider:
    def __init__(
        self,
        name: str,
        *,
        destinations: dict[str, str],
        poster: JsonPoster,
    ) -> None:
        self._name = name
        self._destinations = destinations
        self._poster = poster

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        url = self._destinations.get(request.recipient)
        if url is None:
            return unmapped(self._name, request.recipient)
        return await self._poster.post_sent(url, dumps(teams_message(request)))

    async def close(self) -> None:
        """The session belongs to the caller that passed it in."""


def teams_message(request: DeliveryRequest) -> dict[str, Any]:
    body: list[dict[str, Any]] = []
    if request.subject:
        body.append(
            {
                "type": "TextBlock",
                "text": request.subject,
                "weight": "Bolder",
                "size": "Medium",
                "wrap": True,
            }
        )
    body.append({"type": "TextBlock", "text": request.body, "wrap": True})
    card = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": body,
    }
    return {
        "type": "message",
        "attachments": [{"contentType": ADAPTIVE_CARD, "contentUrl": None, "content": card}],
    }
