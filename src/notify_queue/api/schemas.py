"""The API's wire shapes: pydantic models for the OpenAPI document and the output.

docs/api-reference.md is generated from them.

Output models serialise the domain records of `notify_queue.models` in camelCase with RFC 3339
UTC times ending in `Z`. The create-request models here *describe* the body for the OpenAPI
document; the rules themselves live once, in `services.validation.NotificationRequest` (which also
checks what JSON Schema cannot say: recipient formats per channel, UTF-8 byte sizes, expiresAt
after the send time). `tests/api/test_openapi.py` keeps the two field lists equal.
"""

from __future__ import annotations

import functools
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, WithJsonSchema
from pydantic.alias_generators import to_camel

from notify_queue import limits
from notify_queue import models as domain
from notify_queue.models import Channel, Priority, Source, Status, WaitingReason


@functools.lru_cache(maxsize=256)
def rfc3339(moment: datetime) -> str:
    """`2026-09-24T12:00:00.123456Z`: UTC, always with the `Z` (never `+00:00`).

    Remembered: the rows of one statement share their `createdAt` and `updatedAt` (the
    transaction's `now()`) and a batch's items their `sendAt`, so a batch's answer formats a few
    moments, not four thousand. Equal datetimes are equal instants, so the text is the same."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


UtcTime = Annotated[
    datetime,
    PlainSerializer(rfc3339, return_type=str),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]


class _Wire(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        frozen=True,
        field_title_generator=lambda name, _: to_camel(name),
    )


# --- requests (described here, validated by services.validation) ---------------------------

_KEY_PATTERN = "^[!-~]{1,255}$"  # 1-255 printable ASCII characters, no space


class DigestCreate(_Wire):
    """Join the recipient's open digest for `key` on the channel (docs/digests.md): one message
    when `windowSeconds` have passed since it opened or `maxItems` joined."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(pattern=_KEY_PATTERN)
    window_seconds: int = Field(ge=1, le=limits.MAX_DIGEST_WINDOW_SECONDS)
    max_items: int = Field(
        limits.DEFAULT_DIGEST_ITEMS, ge=limits.MIN_DIGEST_ITEMS, le=limits.MAX_DIGEST_ITEMS
    )
    template: str | None = Field(
        None,
        pattern=limits.TEMPLATE_NAME_PATTERN.pattern,
        description="A stored template rendered with `items` and `count` when the digest is "
        "sent; without one, the first subject (+N more) and the bodies one a line.",
    )


class EscalationStepCreate(_Wire):
    model_config = ConfigDict(extra="forbid")

    channel: Channel
    after_seconds: int | None = Field(
        None,
        ge=0,
        le=limits.MAX_DELAY_SECONDS,
        description="Seconds after the creation; not less than the step before's [the step "
        "before's; 0 for the first].",
    )


class EscalationCreate(_Wire):
    model_config = ConfigDict(extra="forbid")

    steps: list[EscalationStepCreate] = Field(min_length=1, max_length=limits.MAX_ESCALATION_STEPS)


class NotificationCreate(_Wire):
    """A notification to enqueue. The idempotency key comes in the `Idempotency-Key` header or
    in `idempotencyKey` (one of them is required; both present must be equal). It goes to an
    address (`channel` + `recipient`) or to a stored recipient (`recipientId`), and carries its
    text (`body`, optional `subject`) or names a template (`template` + `data`)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "allOf": [
                {"oneOf": [{"required": ["channel", "recipient"]}, {"required": ["recipientId"]}]},
                {"oneOf": [{"required": ["body"]}, {"required": ["template"]}]},
            ]
        },
    )

    channel: Channel | None = Field(None, description="Required unless recipientId is given.")
    recipient: str | None = Field(
        None,
        min_length=1,
        max_length=limits.MAX_RECIPIENT_CHARS,
        description="email: an address (answered with its domain IDNA-encoded in lower case); "
        "sms, voice: a phone number, answered in E.164 (`+` and 8-15 digits; a national number "
        "needs --default-region); push: a device token; chat, webhook, incident: a destination "
        'name (docs/channels.md; docs/recipients.md, "Addresses"). '
        "Required unless recipientId is given (not both).",
    )
    subject: str | None = Field(
        None,
        max_length=limits.MAX_SUBJECT_CHARS,
        description="One line: no control characters but TAB, no U+2028/U+2029, and no RFC 2047 "
        "encoded word that decodes to one (docs/security.md).",
    )
    body: str | None = Field(
        None,
        min_length=1,
        max_length=limits.MAX_BODY_BYTES,
        description=f"1-{limits.MAX_BODY_BYTES} bytes of UTF-8. Required unless template is given.",
    )
    recipient_id: str | None = Field(
        None,
        pattern=_KEY_PATTERN,
        description="A stored recipient instead of channel + recipient: the answer is "
        "`{notifications: [...]}`, one per channel chosen (docs/recipients.md).",
    )
    channels: list[Channel] | None = Field(
        None,
        min_length=1,
        max_length=len(Channel),
        description="With recipientId: the channels in order of preference [email, sms, push].",
    )
    strategy: Literal["all", "first"] | None = Field(
        None, description="With recipientId: every allowed channel, or only the first [all]."
    )
    category: str | None = Field(
        None,
        pattern=limits.CATEGORY_PATTERN.pattern,
        description="What kind of message this is, for opt-outs [transactional]; `critical` "
        "passes quiet hours.",
    )
    template: str | None = Field(
        None,
        pattern=limits.TEMPLATE_NAME_PATTERN.pattern,
        description="A stored template instead of subject + body, rendered now with `data`.",
    )
    data: dict[str, Any] | None = Field(
        None, description="The template's variables; a missing one is a 400."
    )
    priority: Priority = Priority.NORMAL
    send_at: datetime | None = Field(
        None, description="RFC 3339 with an offset; not together with delaySeconds."
    )
    delay_seconds: int | None = Field(
        None, ge=0, le=limits.MAX_DELAY_SECONDS, description="Seconds from now; not with sendAt."
    )
    expires_at: datetime | None = Field(
        None, description="Not sent by then: EXPIRED. Must be after the send time."
    )
    webhook_url: str | None = Field(
        None, max_length=2048, pattern="^[Hh][Tt][Tt][Pp][Ss]?://", description="http(s) URL."
    )
    policy: str | None = Field(
        None,
        pattern=limits.POLICY_PATTERN.pattern,
        description="namespace/name of a NotificationPolicy.",
    )
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description=f"Any JSON object up to {limits.MAX_METADATA_BYTES} bytes.",
    )
    idempotency_key: str | None = Field(None, pattern=_KEY_PATTERN)
    digest: DigestCreate | None = Field(
        None,
        description="Many events, one message (not with HIGH, sendAt, delaySeconds, expiresAt).",
    )
    escalation: EscalationCreate | None = Field(
        None,
        description="With recipientId (not channels, strategy, sendAt or delaySeconds): one "
        "notification per step until acknowledged; the answer is `{escalation, notifications}` "
        "(docs/escalation.md). Not in a batch.",
    )


class BatchNotificationCreate(NotificationCreate):
    """One item of a batch: as a single create, with `idempotencyKey` required."""

    idempotency_key: str = Field(pattern=_KEY_PATTERN)


class BatchCreate(_Wire):
    model_config = ConfigDict(extra="forbid")

    # Any item is accepted at the request level: one that is not a valid
    # BatchNotificationCreate gets a 400 *result* of its own, and the others still go ahead.
    notifications: list[BatchNotificationCreate | Any] = Field(
        max_length=1000,
        description="Up to 1,000 BatchNotificationCreate items; an invalid item gets a 400 result.",
    )


class RetryBatchRequest(_Wire):
    """Retry up to `limit` notifications in `status`, oldest first. Also validates the body."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["DEAD_LETTERED", "FAILED"] = "DEAD_LETTERED"
    limit: int = Field(1000, ge=1, le=1000)


# --- responses --------------------------------------------------------------------------------


class Retry(_Wire):
    at: UtcTime
    from_status: Status


class TemplateRef(_Wire):
    name: str
    version: int


class DeliveryAttempt(_Wire):
    at: UtcTime
    provider: str
    outcome: str = Field(
        description="sent, temporary_failure, permanent_failure, or circuit_open / "
        "provider_limited when the provider was skipped without a call."
    )
    error: str | None
    duration_ms: float | None


class Waiting(_Wire):
    """Why a PENDING notification is not due yet (docs/design.md "Why a notification waits")."""

    reason: WaitingReason
    until: UtcTime | None = Field(description="When it becomes due again, where known.")
    detail: str = Field(
        description="One sentence: what it waits for; of a Scheduled one, when it is due "
        "(`due at 2026-12-07T18:00:00Z`)."
    )


class DigestRef(_Wire):
    """The digest a notification belongs to."""

    key: str
    id: uuid.UUID = Field(description="Shared by the digest's notifications.")
    count: int = Field(description="Its items so far.")


class DeliveryReceipt(_Wire):
    """A SENT notification's latest delivery receipt."""

    state: Literal["delivered", "bounced", "complained"]
    at: UtcTime = Field(description="When the vendor says it happened, else when it arrived.")
    reason: str | None

    @classmethod
    def of(cls, d: domain.Delivery) -> DeliveryReceipt:
        return cls(state=d.state, at=d.at, reason=d.reason)


class Notification(_Wire):
    id: uuid.UUID
    idempotency_key: str
    channel: Channel
    recipient: str
    subject: str | None
    body: str
    priority: Priority
    status: Status
    send_at: UtcTime
    next_attempt_at: UtcTime
    waiting: Waiting | None = Field(
        description="null when it is final, processing, or due and waiting only for a worker."
    )
    expires_at: UtcTime | None
    attempt_count: int
    max_attempts: int
    last_error: str | None
    sent_at: UtcTime | None
    provider_message_id: str | None
    provider: str | None = Field(description="The provider that sent it; null until SENT.")
    delivery_attempts: list[DeliveryAttempt] = Field(
        description="The last 20 provider calls and skips, oldest first."
    )
    delivery: DeliveryReceipt | None = Field(
        description="What the provider reported after accepting it (docs/receipts.md); null "
        "until a receipt arrives. The status stays SENT."
    )
    retries: list[Retry]
    source: Source
    metadata: dict[str, Any]
    created_at: UtcTime
    updated_at: UtcTime
    category: str
    recipient_id: str | None = Field(description="The stored recipient it was sent to, if any.")
    template: TemplateRef | None = Field(description="The template it was rendered from, if any.")
    digest: DigestRef | None = Field(None, description="Its digest, if it joined one.")

    @classmethod
    def of(cls, n: domain.Notification) -> Notification:
        return cls(
            id=n.id,
            idempotency_key=n.idempotency_key,
            channel=n.channel,
            recipient=n.recipient,
            subject=n.subject,
            body=n.body,
            priority=n.priority,
            status=n.status,
            send_at=n.send_at,
            next_attempt_at=n.next_attempt_at,
            waiting=None
            if n.waiting is None
            else Waiting(
                reason=n.waiting.reason, until=n.waiting.until, detail=waiting_detail(n.waiting)
            ),
            expires_at=n.expires_at,
            attempt_count=n.attempt_count,
            max_attempts=n.max_attempts,
            last_error=n.last_error,
            sent_at=n.sent_at,
            provider_message_id=n.provider_message_id,
            provider=n.provider,
            delivery_attempts=[DeliveryAttempt.model_validate(a) for a in n.delivery_attempts],
            delivery=None
            if n.delivery is None
            else DeliveryReceipt(
                state=n.delivery.state, at=n.delivery.at, reason=n.delivery.reason
            ),
            retries=[Retry(at=r.at, from_status=r.from_status) for r in n.retries],
            source=n.source,
            metadata=n.metadata,
            created_at=n.created_at,
            updated_at=n.updated_at,
            category=n.category,
            recipient_id=n.recipient_id,
            template=TemplateRef(name=n.template.name, version=n.template.version)
            if n.template
            else None,
            digest=None
            if n.digest is None
            else DigestRef(key=n.digest.key, id=n.digest.id, count=n.digest.count),
        )


def notification_json(n: domain.Notification) -> dict[str, Any]:
    """`Notification.of(n).model_dump(mode="json", by_alias=True)`, built directly, for
    `jsontext.dumps` (which writes its UUIDs, in C).

    Every create, read and list answers with this; building the frozen pydantic model (which
    validates each field again) and dumping it cost more than the rest of a create together.
    The model stays the document's schema; `tests/api/test_wire_shapes.py` holds the two's JSON
    text equal, key order included. Delivery attempts (stored JSON, empty until a worker has
    tried) still go through their model, which also normalises their times and numbers. A
    `StrEnum`'s text is `str(member)`, C code, where `.value` runs enum's Python property
    (four per notification); a UUID stays a UUID, its text written by orjson (`str()` is
    Python).
    """
    template = n.template
    waiting = n.waiting
    return {
        "id": n.id,
        "idempotencyKey": n.idempotency_key,
        "channel": str(n.channel),
        "recipient": n.recipient,
        "subject": n.subject,
        "body": n.body,
        "priority": str(n.priority),
        "status": str(n.status),
        "sendAt": rfc3339(n.send_at),
        "nextAttemptAt": rfc3339(n.next_attempt_at),
        "waiting": None if waiting is None else waiting_json(waiting),
        "expiresAt": None if n.expires_at is None else rfc3339(n.expires_at),
        "attemptCount": n.attempt_count,
        "maxAttempts": n.max_attempts,
        "lastError": n.last_error,
        "sentAt": None if n.sent_at is None else rfc3339(n.sent_at),
        "providerMessageId": n.provider_message_id,
        "provider": n.provider,
        "deliveryAttempts": _attempts_json(n.delivery_attempts) if n.delivery_attempts else [],
        "delivery": None
        if n.delivery is None
        else {"state": n.delivery.state, "at": rfc3339(n.delivery.at), "reason": n.delivery.reason},
        "retries": _retries_json(n.retries) if n.retries else [],
        "source": str(n.source),
        "metadata": n.metadata,
        "createdAt": rfc3339(n.created_at),
        "updatedAt": rfc3339(n.updated_at),
        "category": n.category,
        "recipientId": n.recipient_id,
        "template": None
        if template is None
        else {"name": template.name, "version": template.version},
        "digest": None
        if n.digest is None
        else {"key": n.digest.key, "id": n.digest.id, "count": n.digest.count},
    }


def _attempts_json(attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        DeliveryAttempt.model_validate(a).model_dump(mode="json", by_alias=True) for a in attempts
    ]


def _retries_json(retries: list[domain.Retry]) -> list[dict[str, Any]]:
    # Empty for most notifications, as the attempts are: a call only when there is one.
    return [{"at": rfc3339(r.at), "fromStatus": str(r.from_status)} for r in retries]


def waiting_json(w: domain.Waiting) -> dict[str, Any]:
    """A `Waiting` on the wire (the shape of `status.waiting` of a Notification object too)."""
    return {
        "reason": w.reason.value,
        "until": None if w.until is None else rfc3339(w.until),
        "detail": waiting_detail(w),
    }


def waiting_detail(w: domain.Waiting) -> str:
    """The stored detail, but a scheduled notification's says when it is due:
    `due at 2026-12-07T18:00:00Z` (the stored one names only its cause, the same for sendAt and
    delaySeconds). The SQL answers word it alike (nq_notification_json)."""
    if w.reason is not WaitingReason.SCHEDULED or w.until is None:
        return w.detail
    return f"due at {w.until.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


class NotificationPage(_Wire):
    items: list[Notification]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null: last page."
    )


class ReceiptsAccepted(_Wire):
    """What a provider's receipts request came to (docs/receipts.md)."""

    received: int = Field(description="Receipts the request held that say an outcome.")
    matched: int = Field(description="Of those, the ones naming a notification sent here.")
    changed: int = Field(description="Of those, the ones that said more than before.")


class SuppressionItem(_Wire):
    """An address no notification goes to any more (docs/receipts.md)."""

    channel: str
    address: str = Field(description="Normalised: an email address lower-cased.")
    reason: Literal["bounced", "complained"]
    at: datetime
    notification_id: uuid.UUID | None = Field(description="The notification whose receipt said so.")


class SuppressionPage(_Wire):
    items: list[SuppressionItem]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null: last page."
    )


class ProblemFieldError(_Wire):
    field: str = Field(
        description="The field as the client wrote it: `sendAt`, `notifications[3].body`."
    )
    message: str


class Problem(_Wire):
    """RFC 9457 problem details."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    errors: list[ProblemFieldError] | None = Field(None, description="Validation errors (400).")
    existing_id: str | None = Field(
        None, description="409 for a reused idempotency key: the notification it belongs to."
    )


class NotificationList(_Wire):
    """The answer to a user-targeted create: one notification per channel chosen, or one
    SUPPRESSED notification when every channel was opted out."""

    notifications: list[Notification]


class BatchResult(_Wire):
    status: Literal[200, 201, 400, 409]
    notification: Notification | None = Field(
        None, description="With 200 and 201 for an address-targeted item."
    )
    notifications: list[Notification] | None = Field(
        None, description="With 200 and 201 for a user-targeted item (recipientId)."
    )
    error: Problem | None = Field(None, description="With 400 and 409.")


class BatchResponse(_Wire):
    results: list[BatchResult] = Field(description="One per item, in the order sent.")


class RetryBatchResult(_Wire):
    retried: int
    remaining: int = Field(description="Still in that status after this call; repeat until 0.")


class StatusCounts(BaseModel):
    model_config = ConfigDict(frozen=True)

    PENDING: int
    PROCESSING: int
    SENT: int
    FAILED: int
    DEAD_LETTERED: int
    CANCELLED: int
    EXPIRED: int
    SUPPRESSED: int


class DueCounts(BaseModel):
    model_config = ConfigDict(frozen=True)

    HIGH: int
    NORMAL: int
    LOW: int


class ProviderCircuit(_Wire):
    circuit: Literal["closed", "half-open", "open"]
    open_until: UtcTime | None


class DatabaseStatus(_Wire):
    engine: Literal["postgresql", "citus"] = Field(
        description="citus: the extension is installed and at least one worker node is "
        "registered; otherwise postgresql."
    )
    worker_nodes: int = Field(description="Registered Citus worker nodes; 0 for postgresql.")


class QueueStatus(_Wire):
    counts: StatusCounts
    due: DueCounts = Field(description="PENDING and due now, per priority.")
    oldest_due_age_seconds: float
    database: DatabaseStatus = Field(
        description="The engine behind the database URL (read at most every 30 s per process)."
    )
    providers: dict[str, ProviderCircuit] = Field(
        description="The circuit of every provider with a breaker, as all workers share it."
    )

    @classmethod
    def of(cls, s: domain.QueueStatus) -> QueueStatus:
        return cls(
            counts=StatusCounts(**{k.value: v for k, v in s.counts.items()}),
            due=DueCounts(**{k.value: v for k, v in s.due.items()}),
            oldest_due_age_seconds=s.oldest_due_age_seconds,
            database=DatabaseStatus(
                engine=s.database.engine.value, worker_nodes=s.database.worker_nodes
            ),
            providers={
                name: ProviderCircuit(circuit=c.state, open_until=c.open_until)
                for name, c in s.providers.items()
            },
        )


class Health(_Wire):
    status: Literal["ok"]


class Readiness(_Wire):
    status: Literal["ready"]
    schema_version: int


# --- recipients and templates (docs/recipients.md; validated by services.recipients) ----------


class OptOut(_Wire):
    channels: list[Channel] = Field(default_factory=list)
    categories: list[str] = Field(default_factory=list)
    all: bool = False


class QuietHours(_Wire):
    start: str = Field(pattern="^([01][0-9]|2[0-3]):[0-5][0-9]$", description="Local HH:MM.")
    end: str = Field(
        pattern="^([01][0-9]|2[0-3]):[0-5][0-9]$",
        description="Local HH:MM; before start: the window crosses midnight.",
    )


class RecipientPreferences(_Wire):
    opt_out: OptOut = Field(default_factory=OptOut)
    quiet_hours: QuietHours | None = None


class PreferencesPatch(_Wire):
    """Merged into the stored preferences: a field given replaces that field, one absent is
    kept; `quietHours: null` removes the quiet hours."""

    model_config = ConfigDict(extra="forbid")

    opt_out: OptOut | None = None
    quiet_hours: QuietHours | None = None


class RecipientPut(_Wire):
    """A recipient as a whole (PUT replaces it)."""

    model_config = ConfigDict(extra="forbid")

    email: str | None = Field(
        None,
        max_length=limits.MAX_RECIPIENT_CHARS,
        description="Stored with its domain IDNA-encoded in lower case, the local part as sent.",
    )
    phone: str | None = Field(
        None,
        description="Stored in E.164; a national number needs --default-region "
        '(docs/recipients.md, "Addresses").',
    )
    voice: str | None = Field(
        None, description="Where a voice call goes, stored as phone is; absent: phone."
    )
    chat: str | None = Field(
        None, pattern=limits.DESTINATION_PATTERN.pattern, description="A chat destination name."
    )
    webhook: str | None = Field(
        None, pattern=limits.DESTINATION_PATTERN.pattern, description="A webhook destination name."
    )
    incident: str | None = Field(
        None,
        pattern=limits.DESTINATION_PATTERN.pattern,
        description="An incident destination name (a team or service).",
    )
    push_tokens: list[str] = Field(
        default_factory=list, max_length=20, description="A push goes to the first."
    )
    timezone: str = Field("UTC", description="An IANA zone name, e.g. Europe/Berlin.")
    preferences: PreferencesPatch | None = Field(
        None, description="Absent parts are the defaults (nothing opted out, no quiet hours)."
    )


class Recipient(_Wire):
    id: str
    email: str | None
    phone: str | None
    voice: str | None
    chat: str | None
    webhook: str | None
    incident: str | None
    push_tokens: list[str]
    timezone: str
    preferences: RecipientPreferences
    created_at: UtcTime
    updated_at: UtcTime

    @classmethod
    def of(cls, r: domain.Recipient) -> Recipient:
        p = r.preferences
        quiet = (
            QuietHours(start=p.quiet_start.strftime("%H:%M"), end=p.quiet_end.strftime("%H:%M"))
            if p.quiet_start is not None and p.quiet_end is not None
            else None
        )
        return cls(
            id=r.id,
            email=r.email,
            phone=r.phone,
            voice=r.voice,
            chat=r.chat,
            webhook=r.webhook,
            incident=r.incident,
            push_tokens=r.push_tokens,
            timezone=p.timezone,
            preferences=RecipientPreferences(
                opt_out=OptOut(
                    channels=sorted(Channel(c) for c in p.opt_out_channels),
                    categories=sorted(p.opt_out_categories),
                    all=p.opt_out_all,
                ),
                quiet_hours=quiet,
            ),
            created_at=r.created_at,
            updated_at=r.updated_at,
        )


def recipient_json(r: domain.Recipient) -> dict[str, Any]:
    return Recipient.of(r).model_dump(mode="json", by_alias=True)


class TemplateChannel(_Wire):
    model_config = ConfigDict(extra="forbid")

    subject: str | None = Field(None, description="email, push and incident only.")
    body: str


class TemplateChannels(_Wire):
    model_config = ConfigDict(extra="forbid")

    email: TemplateChannel | None = None
    sms: TemplateChannel | None = None
    push: TemplateChannel | None = None
    voice: TemplateChannel | None = Field(None, description="What is spoken: a body only.")
    chat: TemplateChannel | None = Field(
        None, description="Text, or Block Kit: a JSON object with `blocks`."
    )
    webhook: TemplateChannel | None = Field(
        None, description="The POST body: must render a JSON object or array."
    )
    incident: TemplateChannel | None = Field(
        None, description="subject: the summary; body: the details."
    )


class TemplatePut(_Wire):
    """Jinja2 text per channel (sandboxed, strict undefined, no autoescaping: bodies are text)."""

    model_config = ConfigDict(extra="forbid")

    channels: TemplateChannels


class Template(_Wire):
    name: str
    channels: dict[str, dict[str, str]]
    version: int = Field(description="Incremented by every change of channels.")
    source: Source
    created_at: UtcTime
    updated_at: UtcTime

    @classmethod
    def of(cls, t: domain.Template) -> Template:
        return cls(
            name=t.name,
            channels=t.channels,
            version=t.version,
            source=t.source,
            created_at=t.created_at,
            updated_at=t.updated_at,
        )


def template_json(t: domain.Template) -> dict[str, Any]:
    return Template.of(t).model_dump(mode="json", by_alias=True)


class EscalationRef(_Wire):
    id: str
    state: Literal["active", "acknowledged", "exhausted"]


class EscalationCreated(_Wire):
    """A create with `escalation`: the escalation and one notification per step, in order."""

    escalation: EscalationRef
    notifications: list[Notification]


class Escalation(_Wire):
    id: str
    state: Literal["active", "acknowledged", "exhausted"] = Field(
        description="acknowledged once acknowledged; exhausted when every step is final "
        "without an acknowledgement; else active."
    )
    acknowledged_at: UtcTime | None
    acknowledged_by: str | None
    notifications: list[Notification] = Field(description="The steps, in step order.")


class AcknowledgeRequest(_Wire):
    model_config = ConfigDict(extra="forbid")

    by: str | None = Field(None, min_length=1, max_length=255, description="Who acknowledged.")


def escalation_created_json(e: domain.Escalation) -> dict[str, Any]:
    return {
        "escalation": {"id": str(e.id), "state": e.state.value},
        "notifications": [notification_json(n) for n in e.notifications],
    }


def escalation_json(e: domain.Escalation) -> dict[str, Any]:
    return {
        "id": str(e.id),
        "state": e.state.value,
        "acknowledgedAt": None if e.acknowledged_at is None else rfc3339(e.acknowledged_at),
        "acknowledgedBy": e.acknowledged_by,
        "notifications": [notification_json(n) for n in e.notifications],
    }


REQUEST_MODELS: list[type[BaseModel]] = [
    AcknowledgeRequest,
    NotificationCreate,
    BatchCreate,
    RetryBatchRequest,
    RecipientPut,
    PreferencesPatch,
    TemplatePut,
]
RESPONSE_MODELS: list[type[BaseModel]] = [
    Notification,
    ReceiptsAccepted,
    SuppressionPage,
    Escalation,
    EscalationCreated,
    EscalationRef,
    NotificationList,
    Recipient,
    Template,
    NotificationPage,
    BatchResponse,
    RetryBatchResult,
    QueueStatus,
    Health,
    Readiness,
    Problem,
]
