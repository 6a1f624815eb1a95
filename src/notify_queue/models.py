"""The domain's vocabulary: channels, priorities, statuses and the records passed between layers.

Plain frozen dataclasses with slots: they cross the hot path (a claimed batch, a batch of
results) thousands of times a second, so they carry no validation of their own; validation
happens once, at the edge, in `services.validation`.
"""

from __future__ import annotations

import datetime as dt
import enum
import os
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

# The bits a version 7 UUID fixes: the version (7) and the RFC 9562 variant (0b10).
_UUID7_FIXED = (0xF << 76) | (0x3 << 62)
_UUID7_SET = (0x7 << 76) | (0x2 << 62)
# Read once: an enum member through its class runs enum's Python property.
_SAFE_UNKNOWN = uuid.SafeUUID.unknown


def time_ordered_uuid() -> uuid.UUID:
    """A UUID version 7 (RFC 9562): 48 bits of Unix milliseconds, then 74 random bits.

    Notification ids are the primary key, and ids made close in time sort close together: new
    rows land on the same few pages of the primary-key index instead of a random page each,
    which keeps the index's working set small and the WAL of each claim flat as history grows
    (random v4 ids made every updated row dirty a page of its own at millions of rows).

    Made as CPython 3.14's own `uuid7()` makes its UUID (`UUID._from_int`): the value is a
    valid UUID by construction, so `UUID(int=...)`'s checks of its arguments (a large part of its
    cost, once per created notification) are skipped.
    """
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
    made = object.__new__(uuid.UUID)
    object.__setattr__(made, "int", value & ~_UUID7_FIXED | _UUID7_SET)
    object.__setattr__(made, "is_safe", _SAFE_UNKNOWN)
    return made


# How much outside text (a provider's error body, an SMTP reply, a webhook receiver's answer) is
# kept in `last_error`, and how long a provider's message id may be. Enough to show the peer's
# reason; a peer answering a megabyte cannot make every row and log line a megabyte.
EXTERNAL_ERROR_CHARS = 1000
EXTERNAL_ID_CHARS = 255


def external_text(value: str | bytes | None, limit: int) -> str | None:
    """Outside text made safe to store and log: the one place every peer's words pass through.

    PostgreSQL `text` cannot hold NUL and psycopg refuses strings that are not valid UTF-8 (lone
    surrogates, from `surrogateescape` decoding or a JSON `\ud800`): either would fail the whole
    batch statement that records the result. So bytes are decoded with replacement, NUL and lone
    surrogates become U+FFFD, and the text is cut to `limit` characters.
    """
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    elif not value.isascii():
        value = value.encode("utf-8", errors="surrogatepass").decode("utf-8", errors="replace")
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    return value[:limit]


class Channel(enum.StrEnum):
    EMAIL = "email"
    SMS = "sms"
    PUSH = "push"
    # A phone call (docs/escalation.md): the recipient is an E.164 number, the body is spoken.
    VOICE = "voice"
    # Platform teams' destinations (docs/providers.md, "Chat, webhook and incident providers"): the
    # recipient is a destination name that the provider maps to a channel, URL or team.
    CHAT = "chat"
    WEBHOOK = "webhook"
    INCIDENT = "incident"


# A worker left without --channels serves these only where a provider serves them (they need a
# vendor's provider): a providers file or flags set up for the others start as they did.
OPTIONAL_CHANNELS = frozenset({Channel.CHAT, Channel.WEBHOOK, Channel.INCIDENT})

# A stored channel's text as its member: a dict lookup where `Channel(text)` runs enum's Python
# `__call__`, once per claimed and per listed row.
CHANNEL_BY_VALUE: dict[str, Channel] = {str(c): c for c in Channel}

# The metadata of an incident notification that resolves an escalation step's incident
# (docs/providers.md, "Resolve on acknowledge"): the step's id (its PagerDuty dedup_key) and the
# provider that sent it, which the resolve goes to.
RESOLVES_METADATA = "notifyqueue.io/resolves"
RESOLVE_PROVIDER_METADATA = "notifyqueue.io/provider"

# The channels a recipientId request uses when it names none, in that order (docs/recipients.md).
# `voice` is used only where asked for: a call is the loudest channel, kept for escalation steps
# and requests that name it.
DEFAULT_CHANNELS = (Channel.EMAIL, Channel.SMS, Channel.PUSH)


class Priority(enum.StrEnum):
    """Stored as a small integer (`rank`) so the claim index sorts HIGH first."""

    HIGH = "HIGH"
    NORMAL = "NORMAL"
    LOW = "LOW"

    @property
    def rank(self) -> int:
        return _PRIORITY_RANK[self]

    @classmethod
    def from_rank(cls, rank: int) -> Priority:
        return _PRIORITY_BY_RANK[rank]


_PRIORITY_RANK = {Priority.HIGH: 0, Priority.NORMAL: 1, Priority.LOW: 2}
_PRIORITY_BY_RANK = {rank: p for p, rank in _PRIORITY_RANK.items()}


class Status(enum.StrEnum):
    PENDING = "PENDING"
    PROCESSING = "PROCESSING"
    SENT = "SENT"
    FAILED = "FAILED"
    DEAD_LETTERED = "DEAD_LETTERED"
    CANCELLED = "CANCELLED"
    EXPIRED = "EXPIRED"
    # The recipient opted out (at creation or at send time); `last_error` says why.
    SUPPRESSED = "SUPPRESSED"

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATUSES


FINAL_STATUSES = frozenset(
    {
        Status.SENT,
        Status.FAILED,
        Status.DEAD_LETTERED,
        Status.CANCELLED,
        Status.EXPIRED,
        Status.SUPPRESSED,
    }
)
RETRYABLE_STATUSES = frozenset({Status.FAILED, Status.DEAD_LETTERED})
# Statuses that report to a webhook (docs/webhooks.md).
WEBHOOK_STATUSES = frozenset(
    {Status.SENT, Status.FAILED, Status.DEAD_LETTERED, Status.EXPIRED, Status.SUPPRESSED}
)
# The category a notification has when the request names none (docs/recipients.md).
DEFAULT_CATEGORY = "transactional"
# The category that passes quiet hours whatever its priority.
CRITICAL_CATEGORY = "critical"
# The tenant of every row while tenants are off, and of every row from before them
# (docs/tenants.md).
DEFAULT_TENANT = "default"
# Between a tenant's name and its idempotency key where the key is stored: a character no key or
# tenant name holds, so a key is its tenant's own (docs/tenants.md, "Idempotency keys").
_TENANT_KEY_SEPARATOR = "\x1f"


def stored_key(tenant: str, key: str) -> str:
    """An idempotency key as stored: `default`'s as it is (every row from before tenants keeps
    its key), another tenant's behind its name."""
    return key if tenant == DEFAULT_TENANT else f"{tenant}{_TENANT_KEY_SEPARATOR}{key}"


def client_key(stored: str) -> str:
    """The key as its client gave it (stored_key's inverse)."""
    return stored.rpartition(_TENANT_KEY_SEPARATOR)[2]


class Failover(enum.StrEnum):
    """When a notification moves on to the next provider of its chain.

    OnDefiniteFailure (default): only when the current provider's circuit is open, it is
    rate-limited for longer than the bound, or it answered in a way that proves nothing was sent
    (connection refused, 429, 503). After a timeout the outcome is unknown, so the same provider
    is retried (its idempotency key makes the retry safe there; another provider has no such
    memory and might send a duplicate). Always: also after a timeout (one-time codes, where a late
    duplicate is better than none). Never: the first provider only.
    """

    NEVER = "Never"
    ON_DEFINITE_FAILURE = "OnDefiniteFailure"
    ALWAYS = "Always"


class Source(enum.StrEnum):
    API = "api"
    KUBERNETES = "kubernetes"
    SQL = "sql"  # notify_queue_enqueue, in the caller's own transaction (docs/enqueue.md)


class Outcome(enum.StrEnum):
    """What one delivery attempt came to; also the `outcome` label of the delivery metrics."""

    SENT = "sent"
    TEMPORARY_FAILURE = "temporary_failure"
    PERMANENT_FAILURE = "permanent_failure"
    RATE_LIMITED = "rate_limited"  # the recipient's window is full: waits, no attempt used
    PROVIDER_LIMITED = "provider_limited"  # every provider's send rate is taken: waits, no attempt
    CIRCUIT_OPEN = "circuit_open"  # every provider's circuit is open: waits, no attempt used

    @property
    def uses_attempt(self) -> bool:
        return self not in (Outcome.PROVIDER_LIMITED, Outcome.CIRCUIT_OPEN, Outcome.RATE_LIMITED)


class WaitingReason(enum.StrEnum):
    """Why a PENDING notification is not due yet (docs/design.md, "Why a notification waits").
    Each is written by the statement that defers the row, in that write."""

    SCHEDULED = "Scheduled"  # its send time is ahead (the create)
    BACKOFF = "Backoff"  # a retry after a temporary failure (the completion)
    RECIPIENT_RATE_LIMIT = "RecipientRateLimit"  # the recipient's window is full (the claim)
    PROVIDER_RATE_LIMIT = "ProviderRateLimit"  # every provider it may use is at its rate
    CIRCUIT_OPEN = "CircuitOpen"  # every provider it may use has its circuit open
    QUIET_HOURS = "QuietHours"  # the recipient's quiet hours (the send-time check)
    POLICY_NOT_READY = "PolicyNotReady"  # its NotificationPolicy is not Ready (the claim)
    DIGEST_WINDOW = "DigestWindow"  # its digest is still open (the digest feature writes it)
    ESCALATION_STEP = "EscalationStep"  # a later escalation step (the escalation feature)
    # Due, but no live worker serves its channel and lane: computed when read from the workers'
    # heartbeats (services/waiting.py), never stored.
    NO_WORKER = "NoWorker"


@dataclass(frozen=True, slots=True)
class Waiting:
    """What a PENDING notification waits for: `until` when it is due again (None: not known)."""

    reason: WaitingReason
    until: datetime | None
    detail: str


def current_waiting(
    status: Status,
    reason: str | None,
    until: datetime | None,
    detail: str | None,
) -> Waiting | None:
    """The `waiting` a reader sees now: None unless the row is PENDING with a reason whose
    `until` is still ahead. The stored reason is written once, when the row is deferred, and
    cleared only by the next write of the row (the claim); a row whose `until` has passed is due
    and waits for a worker only, so its old reason is not shown (a due row has no `waiting`). The
    clock is read only for a row with a reason: most have none, and a batch's answer reads one
    per row."""
    if status is not Status.PENDING or reason is None:
        return None
    if until is not None and until <= datetime.now(dt.UTC):
        return None
    return Waiting(WaitingReason(reason), until, detail or reason)


@dataclass(frozen=True, slots=True)
class DigestSpec:
    """What a create asks of its digest (docs/digests.md)."""

    key: str
    window_seconds: int
    max_items: int
    template: str | None = None


@dataclass(frozen=True, slots=True)
class DigestRef:
    """A notification's digest as answered: `{key, id, count}` (count: its items so far)."""

    key: str
    id: uuid.UUID
    count: int


# NewNotification and Notification are built once per created notification on the create path
# (a batch of 1,000 builds 2,000), ClaimedNotification, DeliveryResult and Completion once or
# twice per delivery on the worker's, and none is changed after: slotted, not frozen, because a
# frozen dataclass sets each field through object.__setattr__, a cost per field on every object
# of the hot paths. STYLE.md: on the hot path a slotted dataclass is enough.
@dataclass(slots=True)
class NewNotification:
    """A validated request to enqueue, with its send time already resolved."""

    idempotency_key: str
    request_hash: str
    channel: Channel
    recipient: str
    body: str
    priority: Priority
    send_at: datetime
    subject: str | None = None
    expires_at: datetime | None = None
    webhook_url: str | None = None
    policy: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    source: Source = Source.API
    id: uuid.UUID = field(default_factory=time_ordered_uuid)
    category: str = DEFAULT_CATEGORY
    recipient_id: str | None = None
    template: TemplateRef | None = None
    # SUPPRESSED when the recipient opted out of every channel at creation; `last_error` the reason.
    status: Status = Status.PENDING
    last_error: str | None = None
    # The W3C traceparent of the span that created it (tracing off: None); workers continue it.
    traceparent: str | None = None
    # Join the recipient's open digest for this key and channel (docs/digests.md).
    digest: DigestSpec | None = None
    # An escalation step (docs/escalation.md): its escalation, and the sentence it waits with
    # until its time (reason EscalationStep).
    escalation_id: uuid.UUID | None = None
    escalation_detail: str | None = None
    # The tenant it belongs to (docs/tenants.md); `default` with tenants off.
    tenant: str = DEFAULT_TENANT


@dataclass(frozen=True, slots=True)
class TemplateRef:
    """The template (and its version) a notification's text was rendered from."""

    name: str
    version: int


@dataclass(frozen=True, slots=True)
class Retry:
    at: datetime
    from_status: Status


@dataclass(slots=True)
class Notification:
    """A notification as stored (slotted, not frozen: see NewNotification)."""

    id: uuid.UUID
    idempotency_key: str
    channel: Channel
    recipient: str
    subject: str | None
    body: str
    priority: Priority
    status: Status
    send_at: datetime
    next_attempt_at: datetime
    expires_at: datetime | None
    attempt_count: int
    max_attempts: int
    last_error: str | None
    sent_at: datetime | None
    provider_message_id: str | None
    retries: list[Retry]
    source: Source
    policy: str | None
    webhook_url: str | None
    metadata: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    category: str = DEFAULT_CATEGORY
    recipient_id: str | None = None
    template: TemplateRef | None = None
    # The provider that sent it (else None), and the last 20 provider calls and skips.
    provider: str | None = None
    delivery_attempts: list[dict[str, Any]] = field(default_factory=list)
    # Why it is not due yet (`current_waiting`); None when final, processing, or due.
    waiting: Waiting | None = None
    # The digest it belongs to (docs/digests.md), else None.
    digest: DigestRef | None = None
    # The escalation it is a step of (docs/escalation.md), else None.
    escalation_id: uuid.UUID | None = None
    # What its provider reported after accepting it (docs/receipts.md); None until a receipt.
    delivery: Delivery | None = None


@dataclass(frozen=True, slots=True)
class Delivery:
    """A SENT notification's latest delivery receipt (docs/receipts.md)."""

    state: str  # delivered, bounced or complained
    at: datetime  # when the vendor says it happened, else when the receipt arrived
    reason: str | None


@dataclass(slots=True)
class CreateResult:
    """What enqueueing one request came to: created, the same request again, or a key clash.
    (Slotted, not frozen: one per batch item, see NewNotification.)

    A user-targeted request (recipientId) becomes several notifications, all in `notifications`;
    `notification` is then the first of them."""

    notification: Notification
    created: bool
    conflict: bool = False
    notifications: tuple[Notification, ...] = ()


class EscalationState(enum.StrEnum):
    ACTIVE = "active"
    ACKNOWLEDGED = "acknowledged"
    EXHAUSTED = "exhausted"  # every step final, no acknowledgement (read, never stored)


@dataclass(frozen=True, slots=True)
class Escalation:
    """An escalation and its steps (notifications) in step order."""

    id: uuid.UUID
    state: EscalationState
    recipient_id: str
    acknowledged_at: datetime | None
    acknowledged_by: str | None
    created_at: datetime
    notifications: tuple[Notification, ...]


@dataclass(frozen=True, slots=True)
class EscalationCreated:
    """What a create with `escalation` came to: created, the same request again, or a clash."""

    escalation: Escalation
    created: bool
    conflict: bool = False


@dataclass(slots=True)
class ClaimedNotification:  # not frozen: see NewNotification
    """A notification a worker holds: only the holder of `claim_token` may report its result."""

    id: uuid.UUID
    claim_token: uuid.UUID
    channel: Channel
    recipient: str
    subject: str | None
    body: str
    metadata: dict[str, Any]
    attempt_count: int
    max_attempts: int
    backoff_base_seconds: float
    backoff_max_seconds: float
    priority: Priority
    category: str = DEFAULT_CATEGORY
    expires_at: datetime | None = None
    # Set for a user-targeted notification: the recipient's preferences as the claim read them
    # (in the claim's transaction, so never older than the claim).
    recipient_id: str | None = None
    preferences: Preferences | None = None
    # From the notification's policy: its failover rule and provider chain (None: the worker's).
    failover: Failover | None = None
    providers: tuple[str, ...] | None = None
    # The provider this attempt is bound to as the claim left it (the row's `provider`), and the
    # one the row was bound to before the claim: an earlier attempt there has an unknown outcome,
    # so under OnDefiniteFailure no other provider may be called (services/failover.py).
    bound_provider: str | None = None
    sticky_provider: str | None = None
    # When it first became due (its send time): the due-to-sent latency histogram starts here.
    due_at: datetime | None = None
    # The creator's trace context (the row's `traceparent`): the delivery span's parent.
    traceparent: str | None = None
    # A digest's carrier (docs/digests.md): the digest it sends as one message. Its subject and
    # body above are then the digest's rendering, and the digest id is the provider's
    # idempotency key.
    digest_id: uuid.UUID | None = None
    digest_bucket: int | None = None
    # A digest's carrier: its items' trace contexts, which its delivery span links to (one
    # delivery joins many traces; docs/operations.md "Traces").
    linked_traceparents: tuple[str, ...] = ()
    # Why its address is on the suppression list as the claim read it ("bounced",
    # "complained"; None: it is not): the send-time check ends it SUPPRESSED (docs/receipts.md).
    suppressed: str | None = None
    # Headers the email carries besides its own: the one-click unsubscribe link's
    # (docs/receipts.md), set by the worker when the email may have one.
    email_headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Preferences:
    """A stored recipient's preferences; `exists` False: the recipient was deleted."""

    exists: bool
    opt_out_all: bool = False
    opt_out_channels: frozenset[str] = frozenset()
    opt_out_categories: frozenset[str] = frozenset()
    timezone: str = "UTC"
    quiet_start: dt.time | None = None
    quiet_end: dt.time | None = None


@dataclass(frozen=True, slots=True)
class Recipient:
    """A stored recipient: contacts per channel, timezone and preferences."""

    id: str
    email: str | None
    phone: str | None
    push_tokens: list[str]
    preferences: Preferences
    created_at: datetime
    updated_at: datetime
    # The number to call (E.164); None: `phone` is called.
    voice: str | None = None
    # Destination names (docs/channels.md): where chat, webhook and incident messages go.
    chat: str | None = None
    webhook: str | None = None
    incident: str | None = None

    def contact(self, channel: Channel) -> str | None:
        match channel:
            case Channel.EMAIL:
                return self.email
            case Channel.SMS:
                return self.phone
            case Channel.VOICE:
                return self.voice or self.phone
            case Channel.CHAT:
                return self.chat
            case Channel.WEBHOOK:
                return self.webhook
            case Channel.INCIDENT:
                return self.incident
            case Channel.PUSH:
                return self.push_tokens[0] if self.push_tokens else None


@dataclass(frozen=True, slots=True)
class Template:
    """A stored template: per channel a subject (email, push) and a body, with its version."""

    name: str
    channels: dict[str, dict[str, str]]
    version: int
    source: Source
    created_at: datetime
    updated_at: datetime


@dataclass(slots=True)
class DeliveryResult:  # not frozen: see NewNotification
    """What a provider answered. `retry_after_seconds` is the provider's own hint (Retry-After).

    The peer's words (`provider_message_id`, `error`) are made safe here, when the result is
    built, so no provider can hand the completer a string PostgreSQL refuses.
    """

    outcome: Outcome
    provider_message_id: str | None = None
    error: str | None = None
    retry_after_seconds: float | None = None
    # A temporary failure that proves nothing was sent (connection refused, 429, 503): another
    # provider may be tried at once without risking a duplicate.
    nothing_sent: bool = False
    # A permanent failure because the address or push token no longer exists (HTTP 410).
    address_gone: bool = False
    # Which provider answered (set by the worker's routing, not by providers themselves) and the
    # calls and skips of this attempt, for the delivery record: JSON text, a list of objects.
    provider: str | None = None
    attempts_json: str = "[]"
    # The provider the notification stays bound to after this attempt (set by the routing): the
    # one whose outcome is unknown, else None (services/failover.py `binding_after`).
    bound_provider: str | None = None
    # When nothing was called (CIRCUIT_OPEN, PROVIDER_LIMITED): one sentence naming the
    # provider(s) it waits for, stored as the row's waiting detail (`failover.waiting_result`).
    waiting_detail: str | None = None

    def __post_init__(self) -> None:
        if self.provider_message_id is not None:
            self.provider_message_id = external_text(self.provider_message_id, EXTERNAL_ID_CHARS)
        if self.error is not None:
            self.error = external_text(self.error, EXTERNAL_ERROR_CHARS)


@dataclass(slots=True)
class Completion:  # not frozen: see NewNotification
    """The state change to record for one claimed notification, decided by the delivery rules."""

    id: uuid.UUID
    claim_token: uuid.UUID
    status: Status
    # Seconds from now (the database's clock, so worker clocks never matter) until the next try.
    retry_in_seconds: float | None
    last_error: str | None
    provider_message_id: str | None
    provider: str | None = None
    attempts_json: str = "[]"
    # The attempt the claim counted was not one (every provider open or rate-limited; or the
    # send-time preference check: suppressed, quiet hours, expired): give it back.
    give_back_attempt: bool = False
    # An absolute next due time (a quiet-hours deferral), instead of retry_in_seconds.
    next_attempt_at: datetime | None = None
    # The provider said the address is gone (410): a push token leaves the stored recipient.
    address_gone: bool = False
    # The provider the row stays bound to (the row's `provider`); None clears the binding.
    bound_provider: str | None = None
    # Why a PENDING result waits (docs/design.md); None: `QuietHours` for an absolute
    # next due time, else `Backoff`.
    waiting_reason: str | None = None
    # The one sentence stored with the reason; None: complete_deliveries words it from the
    # reason and the error (Backoff, QuietHours).
    waiting_detail: str | None = None

    @property
    def waits_for(self) -> str | None:
        """The reason stored with a PENDING result; None for a final one."""
        if self.status is not Status.PENDING:
            return None
        if self.waiting_reason is not None:
            return str(self.waiting_reason)  # a WaitingReason is sent as its plain value
        return "QuietHours" if self.next_attempt_at is not None else "Backoff"


@dataclass(frozen=True, slots=True)
class ChannelRateLimit:
    """At most `max_per_window` notifications of one channel per recipient in any rolling
    window of `window_seconds`, beside the recipient-wide limit."""

    max_per_window: int
    window_seconds: float


@dataclass(frozen=True, slots=True)
class Policy:
    """A delivery policy (mirrored from a NotificationPolicy); `None` fields use the defaults."""

    name: str
    rate_limit: int | None = None
    rate_window_seconds: float | None = None
    # Per channel (its value), beside the recipient-wide limit; a channel not named has none.
    channel_rate_limits: dict[str, ChannelRateLimit] = field(default_factory=dict)
    max_attempts: int | None = None
    backoff_base_seconds: float | None = None
    backoff_max_seconds: float | None = None
    webhook_url: str | None = None
    webhook_secrets: tuple[str, ...] = ()
    ttl_seconds_after_finished: int | None = None
    failover: Failover | None = None
    providers: tuple[str, ...] | None = None  # the provider chain to use, in order


@dataclass(frozen=True, slots=True)
class WebhookEvent:
    """One outbox event claimed for dispatch."""

    id: uuid.UUID
    notification_id: uuid.UUID
    url: str
    payload: str
    secrets: tuple[str, ...]
    attempts: int
    claim_token: uuid.UUID


@dataclass(frozen=True, slots=True)
class WebhookResult:
    id: uuid.UUID
    claim_token: uuid.UUID
    delivered: bool
    # A receiver's answer, made safe to store and log when the result is built.
    error: str | None
    # Seconds until the next POST; None and not delivered: out of attempts, the event is failed.
    retry_in_seconds: float | None

    def __post_init__(self) -> None:
        if self.error is not None:
            object.__setattr__(self, "error", external_text(self.error, EXTERNAL_ERROR_CHARS))


@dataclass(frozen=True, slots=True)
class ProviderCircuit:
    state: str  # closed | half-open | open
    open_until: datetime | None


class Wakeup(enum.Enum):
    """What a worker's LISTEN connection heard (docs/design.md "Wake-ups and scheduling")."""

    WORK = "work"  # notifications were written: the claimer looks
    WEBHOOK_EVENTS = "webhook-events"  # webhook events were written, by any process: the relay
    RECONNECTED = "reconnected"  # hints sent while away are lost: every sleeper looks


class Engine(enum.StrEnum):
    """The database engine behind the coordinator's URL (docs/scaling.md)."""

    POSTGRESQL = "postgresql"
    CITUS = "citus"


@dataclass(frozen=True, slots=True)
class DatabaseEngine:
    engine: Engine
    worker_nodes: int  # 0 for plain PostgreSQL


@dataclass(frozen=True, slots=True)
class QueueStatus:
    counts: dict[Status, int]
    due: dict[Priority, int]
    oldest_due_age_seconds: float
    webhook_events: dict[str, int]
    providers: dict[str, ProviderCircuit] = field(default_factory=dict)
    database: DatabaseEngine = DatabaseEngine(Engine.POSTGRESQL, 0)
    # The oldest due age per lane (0: none due in it); `oldest_due_age_seconds` is their maximum.
    oldest_due_age_by_priority: dict[Priority, float] = field(default_factory=dict)
    # PENDING notifications per reason they wait now (every reason, 0 when none); read for
    # /metrics only (`queue_status(waiting=True)`).
    waiting: dict[WaitingReason, int] = field(default_factory=dict)
    # Addresses on the suppression list per channel (docs/receipts.md); read for /metrics only.
    suppressions: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PoolStats:
    """One process's database pool as psycopg_pool counts it (the pool's `get_stats()`): gauges
    of now, and counters since the pool opened."""

    max_connections: int
    connections: int  # open now, in use or idle
    idle: int
    waiting: int  # callers waiting for a connection now
    acquires_total: int
    acquire_wait_seconds_total: float
    acquire_errors_total: int  # timeouts: the caller got DatabaseUnavailable
    connections_lost_total: int


RECEIPT_STATES = ("delivered", "bounced", "complained")


@dataclass(frozen=True, slots=True)
class Receipt:
    """What a vendor says happened to one message it accepted (docs/receipts.md)."""

    provider_message_id: str
    state: str  # one of RECEIPT_STATES
    # A bounce the vendor calls permanent (the address will never take mail); complaints are.
    permanent: bool
    reason: str | None
    # When the vendor says it happened; None: when the receipt arrived.
    at: datetime | None


class ReceiptOutcome(NamedTuple):
    """What one verified receipt came to (docs/receipts.md)."""

    state: str  # delivered, bounced or complained
    matched: bool  # a SENT notification of that provider has that provider message id
    changed: bool  # it said more than the receipt stored before (a repeat changes nothing)


@dataclass(frozen=True, slots=True)
class Suppression:
    """An address no notification is sent to any more, and why (docs/receipts.md)."""

    channel: str
    address: str
    reason: str  # bounced or complained
    at: datetime
    notification_id: uuid.UUID | None
