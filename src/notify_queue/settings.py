"""Typed configuration, in one place, grouped the way each role reads it.

Every option of the command line is a field of exactly one *group* (`DatabaseOptions`,
`WebhookOptions`, ...), with its unit and the reason for its default. Each role's settings are
composed of the groups that role reads (`ApiSettings`, `WorkerSettings`, ...), so a role is
offered only its own options: the command line refuses a flag the role does not read, and
docs/configuration.md (generated from these classes) says which role reads what. The field
names are flat (`settings.rate_limit`), as are the variables (`NOTIFY_QUEUE_RATE_LIMIT`).

A role reads only the variables of its own fields and ignores every other NOTIFY_QUEUE_*
variable, so one ConfigMap or `.env` can serve every role: `NOTIFY_QUEUE_PROVIDER=http` without
a URL stops a worker, and is none of the API's business. The settings validate themselves when
built, so a bad value stops the program at start with one clear line instead of failing later.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import phonenumbers
from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from notify_queue.errors import ConfigurationError
from notify_queue.models import OPTIONAL_CHANNELS, Channel, Failover, Priority


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


class ProviderKind(StrEnum):
    SIMULATED = "simulated"
    HTTP = "http"
    SMTP = "smtp"


class Switch(StrEnum):
    ON = "on"
    OFF = "off"


# Which channels a provider kind can deliver at all. An SMTP server carries email only; the
# HTTP gateway and the simulation take every channel.
PROVIDER_CHANNELS: dict[ProviderKind, frozenset[Channel]] = {
    ProviderKind.SIMULATED: frozenset(Channel),
    ProviderKind.HTTP: frozenset(Channel),
    ProviderKind.SMTP: frozenset({Channel.EMAIL}),
}

Seconds = Annotated[float, Field(gt=0)]


def _comma_list(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class _Options(BaseSettings):
    """What every group shares: the variable prefix, validation at start, immutability.

    `extra="forbid"` refuses unknown *keyword* options (the flags); variables are read per field,
    so a variable that belongs to another role is never seen at all.
    """

    model_config = SettingsConfigDict(
        env_prefix="NOTIFY_QUEUE_", extra="forbid", validate_default=True, frozen=True
    )


# --- groups ----------------------------------------------------------------------------------
# The first docstring line is the group's title in --help and in docs/configuration.md; the
# rest, its explanation there.


class DatabaseOptions(_Options):
    """Database and logging

    Every role reads these.
    """

    database_url: str | None = Field(
        None,
        description="libpq URI of the PostgreSQL database. `up` starts an embedded server under "
        "--data-dir when this is unset; every other role requires it.",
    )
    log_format: LogFormat = Field(
        LogFormat.TEXT, description="text for people, json for log pipelines."
    )
    log_level: str = Field(
        "INFO",
        description="Python logging level name. DEBUG adds a line per HTTP request to the API's "
        "log.",
    )
    database_pool_size: int = Field(
        8,
        ge=1,
        le=200,
        description="Connections per process. Workers need few: one statement serves a whole "
        "batch; the count that matters is processes x pool size against PostgreSQL's "
        "max_connections.",
    )

    database_prepared_statements: Switch = Field(
        Switch.ON,
        description="Whether a query run five times on a connection is prepared on the server "
        "(parsed and planned once). off when --database-url goes through a transaction-mode "
        "pooler that cannot keep them: PgBouncer before 1.21 (Debian 12 ships 1.18), or with "
        "max_prepared_statements = 0. There the next transaction may land on another server "
        "connection and fail with 'prepared statement \"_pg3_0\" does not exist' "
        '(docs/operations.md, "PgBouncer").',
    )

    @property
    def prepares_on_server(self) -> bool:
        return self.database_prepared_statements is Switch.ON

    def require_database_url(self) -> str:
        if not self.database_url:
            raise ConfigurationError(["--database-url (or NOTIFY_QUEUE_DATABASE_URL) is required"])
        return self.database_url


class ListenDatabaseOptions(_Options):
    """Direct database connection

    For the roles that need one session (workers LISTEN for new work, relays for new webhook
    events, the operator for the status outbox; migrate holds an advisory lock), when
    --database-url goes through a transaction-mode pooler such as PgBouncer.
    """

    listen_database_url: str | None = Field(
        None,
        description="libpq URI that reaches PostgreSQL directly (or through a session-mode "
        "pool), for what needs one session: the LISTEN connection, a worker's delivery log "
        "retention run and `migrate` (session-level locks; migrate connects only here when it "
        "is set). One connection per process, plus one during a retention run. Unset: "
        "--database-url.",
    )


class ListenOptions(_Options):
    """Listening address

    Where this process accepts connections: the API's --port, and the --metrics-port of the
    other roles.
    """

    host: str = Field(
        "127.0.0.1",
        description="Address the API and the metrics port listen on; loopback unless exposed on "
        "purpose (in a pod: 0.0.0.0).",
    )


class MetricsOptions(_Options):
    """Metrics

    A small HTTP server for the roles that have no API of their own.
    """

    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Port of /metrics and /healthz (503 while a background task is failing); "
        "unset: none.",
    )


class ApiOptions(_Options):
    """HTTP API"""

    port: int = Field(8080, ge=0, le=65535, description="Port of the API.")
    api_token: str | None = Field(
        None, description="Bearer token for /notifications* and /status; unset means no auth."
    )
    admin_token: str | None = Field(
        None,
        description="Bearer token required for cancel and retry; unset means the API token "
        "suffices.",
    )
    api_workers: int = Field(1, ge=1, le=64, description="uvicorn worker processes for the API.")
    max_body_bytes: int = Field(
        2 * 1024 * 1024,
        ge=1024,
        description="Largest request body accepted, in bytes, checked before it is read into "
        "memory. 2 MiB fits a batch of 1,000 typical notifications.",
    )
    database_timeout: Seconds = Field(
        5.0,
        description="Seconds a call waits for a pooled database connection before it fails (the "
        "API answers 503): long enough to ride out a busy pool, short enough that clients never "
        "hang.",
    )
    api_max_connections: int = Field(
        1000,
        ge=1,
        description="Connections (and requests in flight) one API process holds at once; past "
        "it a request is answered 503 at once. A create holds a connection for milliseconds, "
        "so 1,000 is far above honest load, and it bounds what slow clients can pin.",
    )
    keep_alive_seconds: Seconds = Field(
        5.0,
        description="Seconds an idle kept-alive connection stays open between requests: long "
        "enough for a client's next request, short enough that idle sockets do not pile up.",
    )
    header_timeout_seconds: Seconds = Field(
        10.0,
        description="Seconds a request's header block may take to arrive in full; the connection "
        "is closed past it. Honest clients send headers in one packet; 10 s allows slow links "
        "and stops a slowloris client from holding connections.",
    )
    body_timeout_seconds: Seconds = Field(
        10.0,
        description="Seconds a request's body may take to arrive in full after its headers (the "
        "API answers 408). A 2 MiB body over a 2 Mbit/s link takes 8 s.",
    )
    max_header_bytes: int = Field(
        64 * 1024,
        ge=1024,
        description="Largest request header block, in bytes (the request line included); the "
        "connection is closed past it. Our own headers are well under 1 KiB; proxies add a few.",
    )
    metrics_refresh_seconds: Seconds = Field(
        5.0,
        description="Seconds /metrics serves one snapshot of the queue's figures before reading "
        "them again (one read at a time, however many scrape): the read counts pending rows, "
        "and Prometheus scrapes every 15 s or more.",
    )


class CreationOptions(_Options):
    """Notification defaults

    Fixed when a notification is created (by the API or by the operator for a Notification
    object) and stored with it; workers deliver what each notification says. `migrate` writes it
    and --webhook-url where the SQL function notify_queue_enqueue reads them (docs/enqueue.md).
    """

    max_attempts: int = Field(
        6,
        ge=1,
        le=100,
        description="Attempts before DEAD_LETTERED, for notifications without a "
        "NotificationPolicy: the first plus 5 retries.",
    )


class AddressOptions(_Options):
    """Addresses

    For the roles that create notifications and recipients (the API, the operator): phone
    numbers are stored in E.164, and this says which country a number written without `+` is
    in (docs/recipients.md, "Addresses").
    """

    default_region: str | None = Field(
        None,
        description="ISO 3166-1 region (e.g. GB) of sms and voice numbers written nationally "
        "(`020 7946 0958`). Unset: a number must be E.164 (`+442079460958`), since a national "
        "number could belong to any country. Applies to notifications and stored recipients; "
        "the SQL function notify_queue_enqueue accepts E.164 only.",
    )

    @field_validator("default_region")
    @classmethod
    def _known_region(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if value.upper() not in phonenumbers.SUPPORTED_REGIONS:
            raise ValueError(
                f"{value!r} is not a region phonenumbers knows (an ISO 3166-1 code such as GB)"
            )
        return value.upper()


# The most notifications one claim statement takes: its row locks last as long as its transaction.
MAX_CLAIM_SIZE = 1000


class WorkerOptions(_Options):
    """Worker

    What this worker claims and how much at once.
    """

    concurrency: int = Field(
        256,
        ge=1,
        le=10_000,
        description="Deliveries in flight per worker process. A delivery mostly waits on its "
        "provider: with 256 in flight a provider answering in 100 ms still allows about 2,500 "
        "deliveries/s per process (32 allowed 320/s), and a waiting delivery costs one small "
        "task.",
    )
    batch_size: int | None = Field(
        None,
        ge=1,
        le=MAX_CLAIM_SIZE,
        description="Most notifications claimed by one statement; by default --concurrency (at "
        "most 1000): a worker with every slot free fills them in one claim, since a claim "
        "statement's fixed cost (its admission rules) is paid per call, and each transaction's "
        "row locks stay short. Lower it to spread a backlog over more workers.",
    )
    lease_seconds: Seconds = Field(
        300.0,
        description="Seconds a claim lasts before another worker may take the notification over. "
        "Longer than any provider call; short enough that a crashed worker's work resumes soon.",
    )
    aging_seconds: float = Field(
        600.0,
        ge=0,
        description="Seconds a due NORMAL or LOW notification waits before the claim ranks it one "
        "priority higher (a LOW ranks with HIGH after twice that), so no stream of HIGH starves "
        "LOW; 0 keeps strict priority. Ten minutes: far longer than a healthy queue's wait, so it "
        "changes nothing until a lane is starved.",
    )
    priorities: Annotated[list[Priority], NoDecode] = Field(
        default_factory=lambda: [Priority.HIGH, Priority.NORMAL, Priority.LOW],
        description="The lanes this worker serves (comma-separated). Separate pools per lane keep "
        "one-time codes from waiting behind a campaign.",
    )
    channels: Annotated[list[Channel], NoDecode] = Field(
        default_factory=lambda: list(Channel),
        description="The channels this worker delivers (comma-separated); each needs a provider "
        "that can deliver it. Every channel by default, voice included, so an escalation's call "
        "goes out with no setting (chat, webhook and incident where a provider serves them); list "
        "them to keep a worker off one.",
    )
    shutdown_grace_seconds: Seconds = Field(
        10.0,
        description="On SIGTERM, seconds to let in-flight deliveries finish before the rest is "
        "handed back (without using an attempt).",
    )
    webhook_dispatch: Switch = Field(
        Switch.ON,
        description="Whether this worker also relays the webhook outbox. `off` when `notify-queue "
        "relay` processes do it, so slow receivers never share a process with deliveries.",
    )

    @field_validator("priorities", mode="before")
    @classmethod
    def _split_priorities(cls, value: object) -> object:
        value = _comma_list(value)
        return [str(v).upper() for v in value] if isinstance(value, list) else value

    @field_validator("channels", mode="before")
    @classmethod
    def _split_channels(cls, value: object) -> object:
        return _comma_list(value)

    @model_validator(mode="after")
    def _check_lanes(self) -> WorkerOptions:
        problems = []
        if not self.priorities:
            problems.append("--priorities needs at least one of HIGH, NORMAL, LOW")
        if not self.channels:
            problems.append(f"--channels needs at least one of {', '.join(Channel)}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def claim_size(self) -> int:
        """--batch-size, or by default --concurrency up to the most one claim takes."""
        if self.batch_size is not None:
            return self.batch_size
        return min(self.concurrency, MAX_CLAIM_SIZE)


class RetentionOptions(_Options):
    """Delivery log

    Finished notifications are kept in the delivery log, one partition per day (docs/design.md).
    """

    retention: float = Field(
        30.0,
        ge=0,
        description="Days a finished notification stays in the delivery log (and its idempotency "
        "key is remembered); whole days leave at once, by dropping their partition, never by "
        "deleting rows. 0 keeps everything. Archive a partition before it goes: "
        "docs/operations.md.",
    )


class PollOptions(_Options):
    """Polling"""

    poll_interval: Seconds = Field(
        1.0,
        description="Bounds the delay when a hint is lost: new work wakes workers at once "
        "through LISTEN/NOTIFY, and a worker polls every this many seconds only while its LISTEN "
        "connection is down (regaining it triggers a look); while it listens, an idle worker looks "
        "at its own due times and every 30 s (or this, if longer). A relay alone looks at this, "
        "and new webhook events wake it at once through LISTEN/NOTIFY too.",
    )


class DeliveryPolicyOptions(_Options):
    """Delivery policy defaults

    Used by workers for notifications without a NotificationPolicy, and for what a policy
    leaves unset.
    """

    backoff_base: Seconds = Field(
        0.5,
        description="Seconds of the first backoff ceiling; the wait after attempt n is drawn from "
        "[base*2^(n-1), base*2^n] (equal jitter).",
    )
    backoff_max: Seconds = Field(
        60.0, description="Seconds the backoff never exceeds, Retry-After included."
    )
    rate_limit: int = Field(10, ge=1, description="Notifications per recipient per rolling window.")
    rate_limit_window: Seconds = Field(
        3600.0, description="Seconds of the rolling rate-limit window."
    )

    @model_validator(mode="after")
    def _check_backoff(self) -> DeliveryPolicyOptions:
        if self.backoff_base > self.backoff_max:
            raise ValueError("--backoff-base must not exceed --backoff-max")
        return self


class DefaultWebhookOptions(_Options):
    """Default webhook

    Where events of notifications without a webhook of their own (or their policy's) go. The API
    and the operator read it too: a notification suppressed at creation (its recipient opted out
    of every channel, docs/recipients.md) gets its event in the creating transaction.
    """

    webhook_url: str | None = Field(
        None,
        description="Webhook for notifications without their own or a policy's. Configured by "
        "whoever runs the system, so --outbound-allow does not apply to it.",
    )


class WebhookOptions(DefaultWebhookOptions):
    """Webhooks

    Where events of notifications without a webhook of their own go (--webhook-url, which the API
    and the operator also read: a notification suppressed at creation gets its event there), and
    how stored events are POSTed: by workers (unless --webhook-dispatch off) and by
    `notify-queue relay`.
    """

    webhook_secret: str | None = Field(
        None,
        description="Signing secret, `whsec_<base64>`, for events sent to `--webhook-url` (only "
        "those); several, comma-separated, during a rotation.",
    )
    webhook_max_attempts: int = Field(
        10, ge=1, le=100, description="Webhook POSTs before an event is `failed`."
    )
    webhook_backoff_base: Seconds = Field(
        1.0,
        description="Seconds of the first webhook retry ceiling; doubles per attempt (equal "
        "jitter).",
    )
    webhook_backoff_max: Seconds = Field(
        300.0,
        description="Seconds a webhook retry wait never exceeds: 10 attempts span about 8 minutes.",
    )
    webhook_timeout: Seconds = Field(10.0, description="Seconds one webhook POST may take.")

    @model_validator(mode="after")
    def _check_webhook_secrets(self) -> WebhookOptions:
        if self.webhook_secret and not all(s.startswith("whsec_") for s in self.webhook_secrets):
            raise ValueError("--webhook-secret must look like whsec_<base64>")
        return self

    @property
    def webhook_secrets(self) -> tuple[str, ...]:
        if not self.webhook_secret:
            return ()
        return tuple(s.strip() for s in self.webhook_secret.split(",") if s.strip())


class OutboundOptions(_Options):
    """Outbound guard

    Applies to URLs that API clients and namespace users supply (a notification's webhookUrl, a
    NotificationPolicy's webhook); endpoints configured by whoever runs the system (provider
    URLs, SMTP host, --webhook-url) are reached wherever they are.
    """

    outbound_allow: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="CIDRs or host names that client-supplied URLs may reach even though they "
        "are loopback, private or link-local (comma-separated). Empty: only public addresses.",
    )

    @field_validator("outbound_allow", mode="before")
    @classmethod
    def _split_outbound_allow(cls, value: object) -> object:
        return _comma_list(value)


class ProvidersFileOptions(_Options):
    """Providers file and public URL

    Read by the workers (which provider delivers what) and by the API (how each provider's
    delivery receipts are verified, docs/receipts.md), so both take the same file. The public URL
    is where vendors and recipients reach the API: Twilio signs it, unsubscribe links use it.
    """

    providers_file: Path | None = Field(
        None,
        description="YAML file naming providers, their rate limits and circuit breakers, and a "
        "failover chain per channel (docs/providers.md), and how their receipts are signed "
        "(docs/receipts.md). Unset: the provider flags define one provider per channel, without "
        "breaker, rate limit or receipts.",
    )
    public_url: str | None = Field(
        None,
        description="The API's URL as vendors and recipients reach it "
        "(https://notify.example.com): Twilio signs receipts over it (docs/receipts.md).",
    )

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https?://[^/\s]+(/[^\s]*)?", value):
            raise ValueError("must be an http(s) URL such as https://notify.example.com")
        return value.rstrip("/") if value is not None else None


class UnsubscribeOptions(_Options):
    """One-click unsubscribe

    With --public-url, emails of a category other than transactional and critical to stored
    recipients carry an RFC 8058 List-Unsubscribe link signed with this secret; the API checks
    it (docs/receipts.md). Workers and the API need the same secrets.
    """

    unsubscribe_secret: str | None = Field(
        None,
        description="Secret the unsubscribe links are signed with (HMAC-SHA256); unset: no "
        "links. At least 32 random characters.",
    )
    unsubscribe_previous_secret: str | None = Field(
        None,
        description="The secret before the current one, still accepted on links, so rotating "
        "the secret breaks no link in mail already sent.",
    )


class ProviderOptions(_Options):
    """Providers

    Which provider delivers each channel, and how to reach it: a providers file, or the
    single-provider flags (one provider per channel, named after its type), which a worker given
    a providers file refuses (--provider-timeout aside). The providers file (YAML,
    docs/providers.md) names several providers (`http`, `smtp`, `simulated`), each with its
    options, an optional `rateLimit: {perSecond}` that all workers share, and a
    `circuitBreaker: {failures, openFor}` (5 and 30s unless set), and a failover chain per
    channel. `--failover` decides when a notification moves along its chain: only when nothing
    can have been sent (OnDefiniteFailure, the default: after a timeout the same provider is
    retried, since another could duplicate the message), also after a timeout (Always), or never.
    """

    failover: Failover = Field(
        Failover.ON_DEFINITE_FAILURE,
        description="When to move on to the next provider of a chain, for notifications whose "
        "policy does not say: Never, OnDefiniteFailure (circuit open, rate-limited too long, or "
        "an answer proving nothing was sent; after a timeout the same provider is retried), "
        "Always (also after a timeout: a duplicate is possible).",
    )
    provider: ProviderKind = Field(
        ProviderKind.SIMULATED,
        description="Provider for every channel. `simulated` sends nothing anywhere: it only "
        "records notifications as sent, for demos and tests.",
    )
    email_provider: ProviderKind | None = Field(None, description="Overrides --provider for email.")
    sms_provider: ProviderKind | None = Field(
        None, description="Overrides --provider for sms (smtp cannot deliver sms)."
    )
    push_provider: ProviderKind | None = Field(
        None, description="Overrides --provider for push (smtp cannot deliver push)."
    )
    sim_failure_rate: float = Field(
        0.0, ge=0.0, le=1.0, description="Share of simulated temporary failures."
    )
    sim_latency_ms: float = Field(
        0.0, ge=0.0, description="Milliseconds each simulated delivery takes."
    )
    provider_url: str | None = Field(
        None, description="URL the http provider POSTs to (docs/http-provider.md)."
    )
    provider_timeout: Seconds = Field(
        10.0, description="Seconds before a provider call counts as timed out."
    )
    smtp_host: str | None = Field(None, description="SMTP server host.")
    smtp_port: int = Field(587, ge=1, le=65535, description="SMTP server port.")
    smtp_username: str | None = Field(None, description="SMTP user name.")
    smtp_password: str | None = Field(None, description="SMTP password.")
    smtp_starttls: bool = Field(False, description="Upgrade the SMTP connection with STARTTLS.")
    smtp_from: str = Field(
        "notify-queue@localhost", description="Envelope and header sender of emails."
    )

    def provider_for(self, channel: Channel) -> ProviderKind:
        override = {
            Channel.EMAIL: self.email_provider,
            Channel.SMS: self.sms_provider,
            Channel.PUSH: self.push_provider,
        }.get(channel)  # voice has no flag of its own: --provider (or a providers file)
        return override or self.provider


class OperatorOptions(_Options):
    """Operator"""

    namespace: str | None = Field(
        None, description="Namespace the operator watches; unset: all namespaces."
    )
    status_batch_size: int = Field(
        100, ge=1, le=1000, description="Status patches taken per round."
    )
    status_patches_per_second: float = Field(
        50.0,
        gt=0,
        description="Upper bound on status patches per second sent to the kube-apiserver.",
    )
    status_coalesce_seconds: Seconds = Field(
        1.0,
        description="Seconds the status writer lets changes gather after a wake-up: a "
        "notification sent within them gets one status patch (Sent), not two.",
    )
    scale_interval: Seconds = Field(15.0, description="Seconds between worker scaling rounds.")
    secret_refresh_interval: Seconds = Field(
        60.0,
        description="Seconds between re-reads of the Secrets that NotificationPolicies name: "
        "a rotated webhook key reaches the queue within this time (the operator may only get "
        "Secrets by name, not watch them).",
    )


class MigrateOptions(_Options):
    """Migrations

    docs/upgrading.md: `migrate` applies expand steps, which the previous release keeps working
    with, so it can run while that release serves (the chart's pre-upgrade hook).
    """

    contract: bool = Field(
        False,
        description="Also apply the contract steps (drops, renames: what an older release would "
        "break on). Refused while a process of an older release is connected to the database; "
        "run it once the roll-out is done.",
    )


class UpOptions(_Options):
    """Everything on one machine"""

    data_dir: Path = Field(
        Path(".notify-queue"),
        description="Where `up` keeps its embedded PostgreSQL data (and local kubeconfig).",
    )
    kubernetes: bool = Field(
        False,
        description="Also start a local kube-apiserver and the operator (which then reads the "
        "operator's options).",
    )


# The groups in the order --help and docs/configuration.md show them.
GROUPS: tuple[type[_Options], ...] = (
    DatabaseOptions,
    ListenDatabaseOptions,
    ListenOptions,
    MetricsOptions,
    ApiOptions,
    CreationOptions,
    AddressOptions,
    WorkerOptions,
    RetentionOptions,
    PollOptions,
    DeliveryPolicyOptions,
    WebhookOptions,
    OutboundOptions,
    ProvidersFileOptions,
    UnsubscribeOptions,
    ProviderOptions,
    OperatorOptions,
    MigrateOptions,
    UpOptions,
)


# --- roles -----------------------------------------------------------------------------------


class MigrateSettings(
    DatabaseOptions, ListenDatabaseOptions, CreationOptions, DefaultWebhookOptions, MigrateOptions
):
    """`notify-queue migrate`: also the defaults it writes for notify_queue_enqueue (the API's
    own, from the same variables; docs/enqueue.md)."""


class ApiSettings(
    DatabaseOptions,
    ListenOptions,
    ApiOptions,
    CreationOptions,
    AddressOptions,
    DefaultWebhookOptions,
    ProvidersFileOptions,
    UnsubscribeOptions,
):
    """`notify-queue api`."""


class RelaySettings(
    DatabaseOptions,
    ListenOptions,
    MetricsOptions,
    PollOptions,
    WebhookOptions,
    OutboundOptions,
    ListenDatabaseOptions,
):
    """`notify-queue relay`: the webhook outbox only."""


class WorkerSettings(
    RelaySettings,
    WorkerOptions,
    DeliveryPolicyOptions,
    ProvidersFileOptions,
    UnsubscribeOptions,
    ProviderOptions,
    RetentionOptions,
):
    """`notify-queue worker`: claims and delivers, and relays webhooks like `relay` (unless
    --webhook-dispatch off), so it is a relay's settings and more."""

    @model_validator(mode="after")
    def _check_served_channels_have_providers(self) -> WorkerSettings:
        # A worker that cannot deliver a channel it claims would fail every such notification
        # at delivery time; refusing to start says so once, to whoever started it. A providers
        # file replaces the flags checked here, and is checked when it is loaded.
        if self.providers_file is not None:
            return self
        problems: list[str] = []
        for channel in self.channel_providers:
            kind = self.provider_for(channel)
            if channel not in PROVIDER_CHANNELS[kind]:
                flag = f"{channel}_provider"
                fix = f"--{channel}-provider" if flag in type(self).model_fields else "--provider"
                problems.append(
                    f"the {kind} provider cannot deliver {channel}: set {fix}, "
                    "or leave it out of --channels"
                )
            elif kind is ProviderKind.HTTP and not self.provider_url:
                problems.append("the http provider needs --provider-url")
            elif kind is ProviderKind.SMTP and not self.smtp_host:
                problems.append("the smtp provider needs --smtp-host")
        if problems:
            raise ValueError("; ".join(dict.fromkeys(problems)))
        return self

    @property
    def channel_providers(self) -> dict[Channel, ProviderKind]:
        """The provider kind of each channel this worker serves (and of no other): without
        --channels, not the optional channels its kind cannot deliver (smtp: chat...)."""
        implicit = "channels" not in self.model_fields_set
        return {
            channel: kind
            for channel in self.channels
            if channel in PROVIDER_CHANNELS[kind := self.provider_for(channel)]
            or not (implicit and channel in OPTIONAL_CHANNELS)
        }


class OperatorSettings(
    DatabaseOptions,
    ListenOptions,
    MetricsOptions,
    CreationOptions,
    AddressOptions,
    OperatorOptions,
    DefaultWebhookOptions,
    ListenDatabaseOptions,
):
    """`notify-queue operator`."""


# mypy's pydantic plugin sees each base's generated `model_construct` as a different signature;
# they are the one pydantic method.
class UpSettings(ApiSettings, WorkerSettings, OperatorSettings, UpOptions):  # type: ignore[misc]
    """`notify-queue up`: the API and a worker in one process, and with --kubernetes the operator.

    Being each of those roles' settings, it is handed to each of them unchanged.
    """


ROLE_SETTINGS: dict[str, type[DatabaseOptions]] = {
    "migrate": MigrateSettings,
    "api": ApiSettings,
    "worker": WorkerSettings,
    "relay": RelaySettings,
    "operator": OperatorSettings,
    "up": UpSettings,
}

AnySettings = TypeVar("AnySettings", bound=_Options)


def load_settings(model: type[AnySettings], /, **overrides: object) -> AnySettings:
    """`model`'s settings from the environment plus `overrides` (the flags given), or one line
    of error per problem (`ConfigurationError`)."""
    try:
        given: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
        return model(**given)
    except ValidationError as exc:
        messages = []
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"])
            message = error["msg"].removeprefix("Value error, ")
            flag = where.split(".")[0].replace("_", "-")
            messages.append(f"--{flag}: {message}" if where else message)
        raise ConfigurationError(messages) from None
