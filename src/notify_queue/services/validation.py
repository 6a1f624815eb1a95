"""Validation of notification requests: the one gate into the queue.

The HTTP API and the operator both turn their input into a `NotificationRequest` and call
`to_new_notification`; anything invalid raises `ValidationFailed` naming every bad field (camelCase,
as the client wrote it), so bad input never reaches the database. The request hash is taken over
the request as sent, so repeating a `delaySeconds` request is the same request
(docs/api-notes.md, "Idempotency").
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from notify_queue import jsontext, tracing
from notify_queue.errors import FieldError, ValidationFailed
from notify_queue.headers import header_value_problem
from notify_queue.limits import (
    CATEGORY_PATTERN,
    DEFAULT_DIGEST_ITEMS,
    DESTINATION_CHANNELS,
    DESTINATION_MESSAGE,
    DESTINATION_PATTERN,
    EMAIL_PATTERN,
    IDEMPOTENCY_KEY_PATTERN,
    MAX_BODY_BYTES,
    MAX_CHANNELS,
    MAX_DATA_BYTES,
    MAX_DELAY_SECONDS,
    MAX_DIGEST_ITEMS,
    MAX_DIGEST_WINDOW_SECONDS,
    MAX_ESCALATION_STEPS,
    MAX_METADATA_BYTES,
    MAX_RECIPIENT_CHARS,
    MAX_SUBJECT_CHARS,
    MAX_WEBHOOK_URL_CHARS,
    MIN_DIGEST_ITEMS,
    POLICY_PATTERN,
    RECIPIENT_ID_PATTERN,
    RFC3339_PATTERN,
    SMS_PATTERN,
    TEMPLATE_NAME_PATTERN,
)
from notify_queue.models import (
    DEFAULT_CATEGORY,
    Channel,
    DigestSpec,
    NewNotification,
    Priority,
    Source,
    TemplateRef,
)


def parse_rfc3339(value: str) -> datetime:
    """An RFC 3339 timestamp with an explicit offset, as an aware datetime in UTC."""
    if not RFC3339_PATTERN.fullmatch(value):
        raise ValueError("must be an RFC 3339 date-time with an offset, e.g. 2026-09-24T12:00:00Z")
    # fromisoformat takes at most microseconds: trim nanosecond digits first.
    text = re.sub(r"(\.\d{6})\d+", r"\1", value).replace("z", "Z")
    try:
        return datetime.fromisoformat(text).astimezone(UTC)
    except (ValueError, OverflowError):  # OverflowError: year 1 or 9999 moved out of range by UTC
        raise ValueError("is not a valid date-time") from None


def is_http_url(value: str) -> bool:
    """An absolute http(s) URL with a host part and no white space (what nq_enqueue_errors
    accepts too). Parsed, not matched: the pattern this replaces backtracked quadratically on a
    long URL with a space at its end (docs/security.md); each step here is one pass."""
    if any(c.isspace() for c in value):
        return False
    scheme, separator, _ = value.partition("://")
    if not separator or scheme.lower() not in ("http", "https"):
        return False
    try:
        return bool(urlsplit(value).netloc)
    except ValueError:  # a bracketed host that is not an IP address: "http://[oops]/"
        return False


# Fields checked against a pattern, with what a client is told when one does not match.
_PATTERNS: dict[str, tuple[re.Pattern[str], str]] = {
    "policy": (POLICY_PATTERN, "must be namespace/name of a NotificationPolicy"),
    "idempotency_key": (
        IDEMPOTENCY_KEY_PATTERN,
        "must be 1-255 printable ASCII characters without spaces",
    ),
    "recipient_id": (
        RECIPIENT_ID_PATTERN,
        "must be 1-255 printable ASCII characters without spaces",
    ),
    "category": (CATEGORY_PATTERN, "must be 1-63 lowercase letters, digits, '-', '_' or '.'"),
    "template": (
        TEMPLATE_NAME_PATTERN,
        "must be a template name (lowercase letters, digits, '-', '.')",
    ),
}
# JSON objects with a size limit, as compact UTF-8 JSON.
_JSON_LIMITS = {"metadata": MAX_METADATA_BYTES, "data": MAX_DATA_BYTES}


class DigestRequest(BaseModel):
    """`digest`: join the recipient's open digest for `key` on the channel (docs/digests.md)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=False, frozen=True)

    key: StrictStr
    window_seconds: Annotated[
        StrictInt, Field(ge=1, le=MAX_DIGEST_WINDOW_SECONDS, alias="windowSeconds")
    ]
    max_items: Annotated[
        StrictInt, Field(ge=MIN_DIGEST_ITEMS, le=MAX_DIGEST_ITEMS, alias="maxItems")
    ] = DEFAULT_DIGEST_ITEMS
    template: StrictStr | None = None

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        if not IDEMPOTENCY_KEY_PATTERN.fullmatch(value):
            raise ValueError("must be 1-255 printable ASCII characters without spaces")
        return value

    @field_validator("template")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        if value is not None and not TEMPLATE_NAME_PATTERN.fullmatch(value):
            raise ValueError("must be a template name (lowercase letters, digits, '-', '.')")
        return value


class EscalationStepRequest(BaseModel):
    """One step of an escalation: a channel of the recipient, sent `afterSeconds` after the
    creation unless the escalation is acknowledged first."""

    model_config = ConfigDict(extra="forbid", populate_by_name=False, frozen=True)

    channel: Channel
    after_seconds: Annotated[StrictInt | None, Field(ge=0, le=MAX_DELAY_SECONDS)] = Field(
        None, alias="afterSeconds"
    )


class EscalationRequest(BaseModel):
    """`escalation` of a create (docs/escalation.md): 1-10 steps, afterSeconds non-decreasing,
    the first step's defaulting to 0 (a later step's to the one before it)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=False, frozen=True)

    steps: Annotated[
        list[EscalationStepRequest], Field(min_length=1, max_length=MAX_ESCALATION_STEPS)
    ]

    @field_validator("steps")
    @classmethod
    def _non_decreasing(cls, value: list[EscalationStepRequest]) -> list[EscalationStepRequest]:
        before = 0
        for index, step in enumerate(value):
            if step.after_seconds is not None and step.after_seconds < before:
                raise ValueError(
                    f"afterSeconds must not decrease: step {index} has {step.after_seconds}, "
                    f"the step before it {before}"
                )
            before = step.after_seconds if step.after_seconds is not None else before
        return value

    def after_seconds(self) -> list[int]:
        """Each step's afterSeconds with the defaults applied (0, then the step before's)."""
        out: list[int] = []
        for step in self.steps:
            out.append(step.after_seconds if step.after_seconds is not None else (out or [0])[-1])
        return out


class NotificationRequest(BaseModel):
    """A request to send one notification, with the API's field names and limits
    (docs/api-reference.md)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=False, frozen=True)

    channel: Channel | None = None
    recipient: Annotated[StrictStr | None, Field(min_length=1, max_length=MAX_RECIPIENT_CHARS)] = (
        None
    )
    subject: Annotated[StrictStr | None, Field(max_length=MAX_SUBJECT_CHARS)] = None
    body: StrictStr | None = None
    # User-targeted sends (docs/recipients.md): a stored recipient instead of channel + recipient.
    recipient_id: StrictStr | None = Field(None, alias="recipientId")
    channels: Annotated[list[Channel] | None, Field(min_length=1, max_length=MAX_CHANNELS)] = None
    strategy: Literal["all", "first"] | None = None
    category: StrictStr | None = None
    # A stored template instead of subject + body, rendered from `data` at creation.
    template: StrictStr | None = None
    data: dict[str, Any] | None = None
    priority: Priority = Priority.NORMAL
    send_at: StrictStr | None = Field(None, alias="sendAt")
    delay_seconds: Annotated[StrictInt | None, Field(ge=0, le=MAX_DELAY_SECONDS)] = Field(
        None, alias="delaySeconds"
    )
    expires_at: StrictStr | None = Field(None, alias="expiresAt")
    webhook_url: Annotated[StrictStr | None, Field(max_length=MAX_WEBHOOK_URL_CHARS)] = Field(
        None, alias="webhookUrl"
    )
    policy: StrictStr | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: StrictStr | None = Field(None, alias="idempotencyKey")
    # Many events, one message (docs/digests.md).
    digest: DigestRequest | None = None
    # Escalation until acknowledged (docs/escalation.md): with recipientId only.
    escalation: EscalationRequest | None = None

    @field_validator("recipient")
    @classmethod
    def _recipient_format(cls, value: str | None, info: ValidationInfo) -> str | None:
        # A field validator (channel is validated first), so a bad recipient is named even when
        # other fields are bad too; a model validator would only run once every field is valid.
        if value is None:
            return None
        if not value.strip():
            raise ValueError("must not be blank")
        channel = info.data.get("channel")
        if channel is Channel.EMAIL and not EMAIL_PATTERN.fullmatch(value):
            raise ValueError("must be an email address for channel email")
        if channel in (Channel.SMS, Channel.VOICE) and not SMS_PATTERN.fullmatch(value):
            raise ValueError(f"must be an E.164 number (+ and 8-15 digits) for channel {channel}")
        if channel in DESTINATION_CHANNELS and not DESTINATION_PATTERN.fullmatch(value):
            raise ValueError(DESTINATION_MESSAGE + f" for channel {channel}")
        return value

    @field_validator("subject")
    @classmethod
    def _one_line(cls, value: str | None) -> str | None:
        # An email's Subject header: a line break, plain or encoded, would start a header of the
        # client's own (notify_queue.headers). A push title is one line too.
        problem = None if value is None else header_value_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("body")
    @classmethod
    def _body_size(cls, value: str | None) -> str | None:
        if value is None:
            return None
        size = len(value.encode("utf-8", errors="surrogatepass"))
        if size < 1:
            raise ValueError("must not be empty")
        if size > MAX_BODY_BYTES:
            raise ValueError(f"is {size} bytes of UTF-8; the limit is {MAX_BODY_BYTES}")
        return value

    @field_validator("send_at", "expires_at")
    @classmethod
    def _rfc3339(cls, value: str | None) -> str | None:
        if value is not None:
            parse_rfc3339(value)
        return value

    @field_validator(*_PATTERNS)
    @classmethod
    def _pattern(cls, value: str | None, info: ValidationInfo) -> str | None:
        pattern, message = _PATTERNS[info.field_name or ""]
        if value is not None and not pattern.fullmatch(value):
            raise ValueError(message)
        return value

    @field_validator("webhook_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not is_http_url(value):
            raise ValueError("must be an http or https URL")
        return value

    @field_validator(*_JSON_LIMITS)
    @classmethod
    def _json_size(
        cls, value: dict[str, Any] | None, info: ValidationInfo
    ) -> dict[str, Any] | None:
        if value is not None:
            limit = _JSON_LIMITS[info.field_name or ""]
            size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
            if size > limit:
                raise ValueError(f"is {size} bytes as JSON; the limit is {limit}")
        return value

    @field_validator("channels")
    @classmethod
    def _channels(cls, value: list[Channel] | None) -> list[Channel] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("must not name a channel twice")
        return value

    @classmethod
    def _data_size(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
            if size > MAX_DATA_BYTES:
                raise ValueError(f"is {size} bytes as JSON; the limit is {MAX_DATA_BYTES}")
        return value

    @model_validator(mode="after")
    def _cross_field(self) -> NotificationRequest:
        if self.send_at is not None and self.delay_seconds is not None:
            raise ValueError("sendAt: give sendAt or delaySeconds, not both")
        if self.recipient_id is not None:
            if self.recipient is not None:
                raise ValueError("recipient: give recipient or recipientId, not both")
            if self.channel is not None:
                raise ValueError("channel: with recipientId, name channels (a list) instead")
        else:
            if self.channel is None:
                raise ValueError("channel: is required (or recipientId)")
            if self.recipient is None:
                raise ValueError("recipient: is required (or recipientId)")
            if self.channels is not None:
                raise ValueError("channels: only with recipientId")
            if self.strategy is not None:
                raise ValueError("strategy: only with recipientId")
        if self.escalation is not None:
            if self.recipient_id is None:
                raise ValueError("escalation: only with recipientId")
            if self.channels is not None or self.strategy is not None:
                raise ValueError(
                    "escalation: the steps name the channels; give no channels or strategy"
                )
            if self.send_at is not None or self.delay_seconds is not None:
                raise ValueError(
                    "escalation: steps are timed from the creation (afterSeconds); give no "
                    "sendAt or delaySeconds"
                )
        if self.template is not None:
            if self.body is not None or self.subject is not None:
                raise ValueError("template: give template + data or subject + body, not both")
        else:
            if self.data is not None:
                raise ValueError("data: only with template")
            if self.body is None:
                raise ValueError("body: is required (or template)")
        if self.digest is not None:
            # A digest is sent as one message when it closes: its items have no time of their
            # own (docs/digests.md), and HIGH is for what must not wait.
            if self.escalation is not None:
                raise ValueError("digest: not with escalation")
            if self.priority is Priority.HIGH:
                raise ValueError("digest: not with priority HIGH")
            if self.send_at is not None or self.delay_seconds is not None:
                raise ValueError(
                    "digest: not with sendAt or delaySeconds (the digest's window "
                    "decides when it is sent)"
                )
            if self.expires_at is not None:
                raise ValueError("digest: not with expiresAt (the digest is sent as one message)")
        return self


def _field_name(loc: tuple[int | str, ...], message: str) -> tuple[str, str]:
    # Cross-field errors carry their field at the start of the message ("recipient: ...").
    if not loc and ": " in message:
        name, _, rest = message.partition(": ")
        return name, rest
    return ".".join(str(p) for p in loc) or "body", message


def parse_request(data: object, *, prefix: str = "") -> NotificationRequest:
    """Validate raw JSON-like input; raise ValidationFailed naming every bad field."""
    if not isinstance(data, dict):
        raise ValidationFailed([FieldError(prefix.rstrip(".") or "body", "must be a JSON object")])
    # Required fields are named all at once here; the model's cross-field check stops at one.
    missing = []
    if "recipientId" not in data:
        missing += [n for n in ("channel", "recipient") if n not in data]
    if "template" not in data and "body" not in data:
        missing.append("body")
    errors = [FieldError(prefix + n, _REQUIRED[n]) for n in missing]
    try:
        request = NotificationRequest.model_validate(data)
    except ValidationError as exc:
        for e in exc.errors():
            name, message = _field_name(tuple(e["loc"]), e["msg"].removeprefix("Value error, "))
            if e["type"] == "extra_forbidden" and len(e["loc"]) == 1:
                message = unknown_field_message(name)
            errors.append(FieldError(prefix + name, message))
        raise ValidationFailed(list(dict.fromkeys(errors))) from None
    if errors:
        raise ValidationFailed(errors)
    return request


# Names a newcomer reaches for, and the field each means; a name that differs from a field's
# only in case, `_` or `-` (`recipient_id`, `send_at`) is matched without a list. The same rule
# in nq_unknown_field_message (migration 0052), so both doors say the same.
FIELD_ALIASES = {
    "to": "recipient",
    "message": "body",
    "text": "body",
    "content": "body",
    "title": "subject",
    "delay": "delaySeconds",
}
_UNKNOWN = "Extra inputs are not permitted"


def _folded(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


def unknown_field_message(name: str) -> str:
    """What a client is told of a field a notification does not have: which one it meant,
    when that is clear."""
    fields = [f.alias or n for n, f in NotificationRequest.model_fields.items()]
    meant = FIELD_ALIASES.get(name) or next(
        (f for f in fields if _folded(f) == _folded(name)), None
    )
    return f"is not a field; did you mean `{meant}`?" if meant else _UNKNOWN


_REQUIRED = {
    "channel": "is required (or recipientId)",
    "recipient": "is required (or recipientId)",
    "body": "is required (or template)",
}


def request_hash(data: dict[str, Any]) -> str:
    """A digest of the request as sent, without its idempotency key, independent of key order."""
    sent = dict(data)  # copied in C, then the key dropped: cheaper than a comprehension
    sent.pop("idempotencyKey", None)
    # Sorted keys, compact, UTF-8: the same bytes in every release (stored hashes must match).
    return hashlib.sha256(jsontext.canonical(sent)).hexdigest()


# A key's hash is kept as its first 128 bits (migrations 0035/0036: 16 bytes; a key of an
# earlier release kept all 256, read back as the same 32 hex characters).
STORED_HASH_CHARS = 32


def same_request(a: str, b: str) -> bool:
    """Whether two request hashes, either of them as a key keeps it, name the same request."""
    return a[:STORED_HASH_CHARS] == b[:STORED_HASH_CHARS]


@dataclass(slots=True)
class PreparedRequest:
    """A valid create request with its key, hash and resolved times: what the service enqueues.
    (Slotted, not frozen: one per batch item, see models.NewNotification.)

    A plain request (channel + recipient, subject + body) becomes one notification as it is;
    one with a template is rendered first, and one with a recipientId is expanded over the
    recipient's channels, both by the service, which needs the database for that.
    """

    request: NotificationRequest
    idempotency_key: str
    request_hash: str
    send_at: datetime
    expires_at: datetime | None
    source: Source
    field_prefix: str
    # The trace context of the request that asked for it (notify_queue.tracing; None when off).
    traceparent: str | None = None

    @property
    def category(self) -> str:
        return self.request.category or DEFAULT_CATEGORY

    @property
    def is_plain(self) -> bool:
        return self.request.recipient_id is None and self.request.template is None

    def notification(
        self,
        *,
        channel: Channel,
        recipient: str,
        subject: str | None,
        body: str,
        idempotency_key: str | None = None,
        template: TemplateRef | None = None,
    ) -> NewNotification:
        r = self.request
        return NewNotification(
            idempotency_key=idempotency_key or self.idempotency_key,
            request_hash=self.request_hash,
            channel=channel,
            recipient=recipient,
            subject=subject,
            body=body,
            priority=r.priority,
            send_at=self.send_at,
            expires_at=self.expires_at,
            webhook_url=r.webhook_url,
            policy=r.policy,
            metadata=r.metadata,
            source=self.source,
            category=self.category,
            recipient_id=r.recipient_id,
            template=template,
            traceparent=self.traceparent,
            digest=None
            if r.digest is None
            else DigestSpec(
                key=r.digest.key,
                window_seconds=r.digest.window_seconds,
                max_items=r.digest.max_items,
                template=r.digest.template,
            ),
        )


def prepare_request(
    request: NotificationRequest,
    *,
    idempotency_key: str,
    request_digest: str,
    now: datetime,
    source: Source = Source.API,
    field_prefix: str = "",
) -> PreparedRequest:
    """Resolve the send time and check what depends on it (expiresAt after the send time)."""
    if request.send_at is not None:
        send_at = parse_rfc3339(request.send_at)
    else:
        send_at = now + timedelta(seconds=request.delay_seconds) if request.delay_seconds else now
    expires_at = parse_rfc3339(request.expires_at) if request.expires_at else None
    if expires_at is not None and expires_at <= send_at:
        raise ValidationFailed(
            [FieldError(field_prefix + "expiresAt", "must be after the send time")]
        )
    return PreparedRequest(
        request=request,
        idempotency_key=idempotency_key,
        request_hash=request_digest,
        send_at=send_at,
        expires_at=expires_at,
        source=source,
        field_prefix=field_prefix,
        # Read here, in the request's own task: the service may write it from another (its
        # creates are coalesced), where the current span is someone else's.
        traceparent=tracing.current_traceparent(),
    )


def to_new_notification(
    request: NotificationRequest,
    *,
    idempotency_key: str,
    request_digest: str,
    now: datetime,
    source: Source = Source.API,
    field_prefix: str = "",
) -> NewNotification:
    """A plain request (channel + recipient, subject + body) as the one notification it is."""
    prepared = prepare_request(
        request,
        idempotency_key=idempotency_key,
        request_digest=request_digest,
        now=now,
        source=source,
        field_prefix=field_prefix,
    )
    if not prepared.is_plain:
        raise ValueError("only a plain request is one notification as it is")
    assert request.channel is not None and request.recipient is not None
    assert request.body is not None
    return prepared.notification(
        channel=request.channel,
        recipient=request.recipient,
        subject=request.subject,
        body=request.body,
    )


def check_idempotency_key(value: str, *, field: str = "Idempotency-Key") -> str:
    if not IDEMPOTENCY_KEY_PATTERN.fullmatch(value):
        raise ValidationFailed(
            [FieldError(field, "must be 1-255 printable ASCII characters without spaces")]
        )
    return value
