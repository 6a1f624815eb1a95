"""The API's answers as TypedDicts, camelCase as on the wire (docs/api-reference.md).

Written from the OpenAPI document's components of the same name; tests/enqueue/test_client.py
fails when a component gains, loses or renames a property that its TypedDict does not. Times
are RFC 3339 strings, as the API sends them.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict


class TemplateRef(TypedDict):
    name: str
    version: int


class Retry(TypedDict):
    at: str
    fromStatus: str


class DeliveryAttempt(TypedDict):
    at: str
    provider: str
    outcome: str
    error: str | None
    durationMs: float | None


class Waiting(TypedDict):
    reason: Literal[
        "Scheduled",
        "Backoff",
        "RecipientRateLimit",
        "ProviderRateLimit",
        "CircuitOpen",
        "QuietHours",
        "PolicyNotReady",
        "DigestWindow",
        "EscalationStep",
        "NoWorker",
    ]
    until: str | None
    detail: str


class DigestRef(TypedDict):
    key: str
    id: str
    count: int


class DeliveryReceipt(TypedDict):
    """What the provider reported after accepting it (docs/receipts.md)."""

    state: Literal["delivered", "bounced", "complained"]
    at: str
    reason: str | None


class Notification(TypedDict):
    id: str
    idempotencyKey: str
    channel: str
    recipient: str
    subject: str | None
    body: str
    priority: Literal["HIGH", "NORMAL", "LOW"]
    status: str
    sendAt: str
    nextAttemptAt: str
    waiting: Waiting | None
    expiresAt: str | None
    attemptCount: int
    maxAttempts: int
    lastError: str | None
    sentAt: str | None
    providerMessageId: str | None
    provider: str | None
    deliveryAttempts: list[DeliveryAttempt]
    delivery: DeliveryReceipt | None
    retries: list[Retry]
    source: str
    metadata: dict[str, Any]
    createdAt: str
    updatedAt: str
    category: str
    recipientId: str | None
    template: TemplateRef | None
    digest: DigestRef | None


class NotificationList(TypedDict):
    notifications: list[Notification]


class NotificationPage(TypedDict):
    items: list[Notification]
    nextCursor: str | None


class Problem(TypedDict, total=False):
    type: str
    title: str
    status: int
    detail: str
    errors: list[dict[str, str]] | None
    existingId: str | None


class BatchResult(TypedDict, total=False):
    status: int
    notification: Notification | None
    notifications: list[Notification] | None
    error: Problem | None


class BatchResponse(TypedDict):
    results: list[BatchResult]


class RetryBatchResult(TypedDict):
    retried: int
    remaining: int


class ProviderCircuit(TypedDict):
    circuit: str
    openUntil: str | None


class QueueStatus(TypedDict):
    counts: dict[str, int]
    due: dict[str, int]
    oldestDueAgeSeconds: float
    database: Any
    providers: dict[str, ProviderCircuit]


class OptOut(TypedDict):
    channels: list[str]
    categories: list[str]
    all: bool


class QuietHours(TypedDict):
    start: str
    end: str


class RecipientPreferences(TypedDict):
    optOut: OptOut
    quietHours: QuietHours | None


class Recipient(TypedDict):
    id: str
    email: str | None
    phone: str | None
    voice: str | None
    chat: str | None
    webhook: str | None
    incident: str | None
    pushTokens: list[str]
    timezone: str
    preferences: RecipientPreferences
    createdAt: str
    updatedAt: str


class Template(TypedDict):
    name: str
    channels: dict[str, dict[str, str]]
    version: int
    source: str
    createdAt: str
    updatedAt: str


class Escalation(TypedDict):
    """GET /escalations/{id} and the acknowledgement's answer (docs/escalation.md)."""

    id: str
    state: Literal["active", "acknowledged", "exhausted"]
    acknowledgedAt: str | None
    acknowledgedBy: str | None
    notifications: list[Notification]


class EscalationRef(TypedDict):
    id: str
    state: Literal["active", "acknowledged", "exhausted"]


class EscalationCreated(TypedDict):
    """A create with `escalation`: the escalation and one notification per step."""

    escalation: EscalationRef
    notifications: list[Notification]


# The components these are checked against, by name (tests/enqueue/test_client.py).
CHECKED: dict[str, type] = {
    "TemplateRef": TemplateRef,
    "Retry": Retry,
    "DeliveryAttempt": DeliveryAttempt,
    "DigestRef": DigestRef,
    "Notification": Notification,
    "NotificationList": NotificationList,
    "NotificationPage": NotificationPage,
    "Problem": Problem,
    "BatchResult": BatchResult,
    "BatchResponse": BatchResponse,
    "RetryBatchResult": RetryBatchResult,
    "ProviderCircuit": ProviderCircuit,
    "QueueStatus": QueueStatus,
    "OptOut": OptOut,
    "QuietHours": QuietHours,
    "RecipientPreferences": RecipientPreferences,
    "Recipient": Recipient,
    "Template": Template,
    "Escalation": Escalation,
    "EscalationRef": EscalationRef,
    "EscalationCreated": EscalationCreated,
}
