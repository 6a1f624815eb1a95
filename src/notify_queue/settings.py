"""Typed configuration, in one place.

Every option of CONTRACT section 2 is a field here, with its unit and the reason for its default.
Each is read from `NOTIFY_QUEUE_<OPTION>` and from its command-line flag (flags win; see `cli`).
The settings validate themselves when built, so a bad value stops the program at start with one
clear line instead of failing later inside a worker.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from notify_queue.errors import ConfigurationError
from notify_queue.models import Channel, Failover, Priority


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


class Switch(StrEnum):
    ON = "on"
    OFF = "off"


class ProviderKind(StrEnum):
    SIMULATED = "simulated"
    HTTP = "http"
    SMTP = "smtp"


Seconds = Annotated[float, Field(gt=0)]


class Settings(BaseSettings):
    """All options; `Field.description` is the flag's help and the configuration reference."""

    model_config = SettingsConfigDict(
        env_prefix="NOTIFY_QUEUE_", extra="forbid", validate_default=True, frozen=True
    )

    # --- all roles -------------------------------------------------------------------------
    database_url: str | None = Field(
        None,
        description="libpq URI of the PostgreSQL database. `up` starts an embedded server under "
        "--data-dir when this is unset; every other role requires it.",
    )
    data_dir: Path = Field(
        Path(".notify-queue"),
        description="Where `up` keeps its embedded PostgreSQL data (and local kubeconfig).",
    )
    log_format: LogFormat = Field(
        LogFormat.TEXT, description="text for people, json for log pipelines."
    )
    log_level: str = Field("INFO", description="Python logging level name.")
    database_pool_size: int = Field(
        8,
        ge=1,
        le=200,
        description="Connections per process. Workers need few: one statement serves a whole "
        "batch; "
        "the count that matters is processes x pool size against PostgreSQL's max_connections.",
    )

    database_timeout: Seconds = Field(
        5.0,
        description="Seconds a call waits for a pooled database connection before it fails (the "
        "API answers 503): long enough to ride out a busy pool, short enough that clients never "
        "hang.",
    )

    # --- api -----------------------------------------------------------------------------
    host: str = Field(
        "127.0.0.1", description="Address the API listens on; loopback unless exposed on purpose."
    )
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
        "memory. "
        "2 MiB fits a batch of 1,000 typical notifications.",
    )

    # --- worker --------------------------------------------------------------------------
    concurrency: int = Field(
        32, ge=1, le=10_000, description="Deliveries in flight per worker process."
    )
    batch_size: int = Field(
        100,
        ge=1,
        le=1000,
        description="Most notifications claimed by one statement. 100 amortises the round trip "
        "while keeping each transaction's row locks short.",
    )
    poll_interval: Seconds = Field(
        1.0,
        description="Seconds between polls when no wake-up arrives; new work also wakes workers "
        "at once "
        "through LISTEN/NOTIFY, so this only bounds the delay when a hint is lost.",
    )
    lease_seconds: Seconds = Field(
        300.0,
        description="Seconds a claim lasts before another worker may take the notification over. "
        "Longer than any provider call; short enough that a crashed worker's work resumes soon.",
    )
    priorities: Annotated[list[Priority], NoDecode] = Field(
        default_factory=lambda: [Priority.HIGH, Priority.NORMAL, Priority.LOW],
        description="The lanes this worker serves (comma-separated). Separate pools per lane keep "
        "one-time codes from waiting behind a campaign.",
    )
    channels: Annotated[list[Channel], NoDecode] = Field(
        default_factory=lambda: [Channel.EMAIL, Channel.SMS, Channel.PUSH],
        description="The channels this worker delivers (comma-separated).",
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Port of /metrics and /healthz (503 while a background task is failing); "
        "unset: none.",
    )
    webhook_dispatch: Switch = Field(
        Switch.ON,
        description="on: this worker also relays the webhook outbox; off: `notify-queue relay` "
        "processes do it, so webhook POSTs never share the delivery loop.",
    )
    shutdown_grace_seconds: Seconds = Field(
        10.0,
        description="On SIGTERM, seconds to let in-flight deliveries finish before the rest is "
        "handed "
        "back (without using an attempt).",
    )

    # --- delivery policy defaults ---------------------------------------------------------
    max_attempts: int = Field(
        6, ge=1, le=100, description="Attempts before DEAD_LETTERED: the first plus 5 retries."
    )
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
    webhook_url: str | None = Field(
        None, description="Webhook for notifications without their own or a policy's."
    )
    webhook_secret: str | None = Field(
        None,
        description="Signing secret, `whsec_<base64>`; several, comma-separated, during a "
        "rotation.",
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
    outbound_allow: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="CIDRs or host names outbound calls (webhooks, HTTP provider) may reach "
        "even though "
        "they are loopback, private or link-local. Empty: only public addresses.",
    )

    # --- providers ------------------------------------------------------------------------
    providers_file: Path | None = Field(
        None,
        description="YAML file naming providers, their rate limits and circuit breakers, and a "
        "failover chain per channel (docs/configuration.md). Unset: the flags below define one "
        "provider per channel, without breaker or rate limit.",
    )
    failover: Failover = Field(
        Failover.ON_DEFINITE_FAILURE,
        description="When to move on to the next provider of a chain, for notifications whose "
        "policy does not say: Never, OnDefiniteFailure (circuit open, rate-limited too long, or "
        "an answer proving nothing was sent; after a timeout the same provider is retried), "
        "Always (also after a timeout: a duplicate is possible).",
    )
    provider: ProviderKind = Field(
        ProviderKind.SIMULATED, description="Provider for every channel."
    )
    email_provider: ProviderKind | None = Field(None, description="Overrides --provider for email.")
    sms_provider: ProviderKind | None = Field(None, description="Overrides --provider for sms.")
    push_provider: ProviderKind | None = Field(None, description="Overrides --provider for push.")
    sim_failure_rate: float = Field(
        0.0, ge=0.0, le=1.0, description="Share of simulated temporary failures."
    )
    sim_latency_ms: float = Field(
        0.0, ge=0.0, description="Milliseconds each simulated delivery takes."
    )
    provider_url: str | None = Field(
        None, description="URL the http provider POSTs to (CONTRACT section 5)."
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

    # --- operator -------------------------------------------------------------------------
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
    scale_interval: Seconds = Field(15.0, description="Seconds between worker scaling rounds.")
    kubernetes: bool = Field(
        False, description="`up` also starts a local kube-apiserver and the operator."
    )

    @field_validator("priorities", "channels", "outbound_allow", mode="before")
    @classmethod
    def _split_commas(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if info.field_name == "priorities" and isinstance(value, list):
            value = [str(v).upper() for v in value]
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        problems: list[str] = []
        if self.backoff_base > self.backoff_max:
            problems.append("--backoff-base must not exceed --backoff-max")
        if not self.priorities:
            problems.append("--priorities needs at least one of HIGH, NORMAL, LOW")
        if not self.channels:
            problems.append("--channels needs at least one of email, sms, push")
        for kind in self.channel_providers.values():
            if kind is ProviderKind.HTTP and not self.provider_url:
                problems.append("the http provider needs --provider-url")
            if kind is ProviderKind.SMTP and not self.smtp_host:
                problems.append("the smtp provider needs --smtp-host")
        if self.webhook_secret:
            for secret in self.webhook_secrets:
                if not secret.startswith("whsec_"):
                    problems.append("--webhook-secret must look like whsec_<base64>")
        if problems:
            raise ValueError("; ".join(sorted(set(problems))))
        return self

    @property
    def channel_providers(self) -> dict[Channel, ProviderKind]:
        return {
            Channel.EMAIL: self.email_provider or self.provider,
            Channel.SMS: self.sms_provider or self.provider,
            Channel.PUSH: self.push_provider or self.provider,
        }

    @property
    def webhook_secrets(self) -> tuple[str, ...]:
        if not self.webhook_secret:
            return ()
        return tuple(s.strip() for s in self.webhook_secret.split(",") if s.strip())

    def require_database_url(self) -> str:
        if not self.database_url:
            raise ConfigurationError(["--database-url (or NOTIFY_QUEUE_DATABASE_URL) is required"])
        return self.database_url


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment plus `overrides` (the flags given), or one line of error."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
    except ValidationError as exc:
        messages = []
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"])
            message = error["msg"].removeprefix("Value error, ")
            flag = where.split(".")[0].replace("_", "-")
            messages.append(f"--{flag}: {message}" if where else message)
        raise ConfigurationError(messages) from None
