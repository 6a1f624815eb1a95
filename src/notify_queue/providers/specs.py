"""Named providers and the chain per channel (docs/providers.md), from a file or from flags.

`--providers-file` (YAML) names several providers, each with its type, options, an optional
send-rate limit shared by all workers and a circuit breaker, plus a failover chain per channel.
Without it the single-provider flags (docs/configuration.md, "Providers") define one provider
per channel, named after its type. Either way the worker gets the same `ProviderSpecs`,
validated at start: a chain that names an unknown provider, or a provider listed for a channel
it does not serve, stops the worker with one line instead of failing notifications later.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from notify_queue.errors import ConfigurationError
from notify_queue.models import OPTIONAL_CHANNELS, Channel
from notify_queue.settings import WorkerSettings

NAME = re.compile(r"^[a-z0-9-]{1,63}$")


def _duration_seconds(value: object) -> float:
    """`30s`, `1.5m`, `2h`, `500ms` or a number of seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        # Stripped first: white space on both sides of an optional unit backtracked
        # quadratically (tests/properties/test_linear_patterns.py).
        match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h)?", value.strip())
        if match:
            unit = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[match[2] or "s"]
            return float(match[1]) * unit
    raise ValueError(f"not a duration: {value!r} (use 30s, 5m, 500ms or seconds)")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class RateLimit(_Strict):
    per_second: float = Field(alias="perSecond", gt=0, le=100_000)


class CircuitBreaker(_Strict):
    """Opens after `failures` temporary failures in a row; stays open `open_for_seconds`."""

    failures: int = Field(5, ge=1, le=10_000)
    open_for_seconds: float = Field(30.0, alias="openFor", gt=0)

    @field_validator("open_for_seconds", mode="before")
    @classmethod
    def _duration(cls, value: object) -> float:
        return _duration_seconds(value)


class SecretSource(_Strict):
    """A secret's place (`passwordFrom`, `tokenFrom`, `secretFrom`, `routingKeyFrom`): an
    environment variable or a file, never the providers file itself."""

    env: str | None = None
    file: Path | None = None

    @model_validator(mode="after")
    def _one(self) -> SecretSource:
        if (self.env is None) == (self.file is None):
            raise ValueError("a secret needs exactly one of env or file")
        return self

    def read(self) -> str:
        if self.env is not None:
            value = os.environ.get(self.env)
            if value is None:
                raise ConfigurationError([f"secret: environment variable {self.env} unset"])
            return value
        assert self.file is not None
        try:
            return self.file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigurationError([f"secret: cannot read {self.file}: {exc}"]) from None


class RoutingKey(_Strict):
    """A PagerDuty destination: the Events API integration's routing key, from env or a file."""

    routing_key_from: SecretSource = Field(alias="routingKeyFrom")


# Destination names as recipients of the chat, webhook and incident channels.
DESTINATION = re.compile(r"^[a-z0-9][-a-z0-9._#]{0,127}$")

# The vendor types, their public endpoints (`url` when unset) and the channels they may serve.
VENDOR_URLS = {
    "slack": "https://slack.com/api",
    "pagerduty": "https://events.pagerduty.com/v2/enqueue",
    "opsgenie": "https://api.opsgenie.com/v2/alerts",
}
VENDOR_TYPES = ("slack", "teams", "webhook", "pagerduty", "opsgenie")
# Each vendor's published rate per destination, the default `destinationRateLimit`
# (docs/providers.md, "Per-destination rate limits"): Slack posts 1 message per second per
# channel; a Teams incoming webhook takes 4 requests per second; PagerDuty's Events API 120 events
# per minute per routing key. Opsgenie's limits are per account and plan, and a plain webhook has
# none of its own: no default there.
VENDOR_DESTINATION_RATES: dict[str, float] = {"slack": 1.0, "teams": 4.0, "pagerduty": 2.0}


class HttpReceipts(_Strict):
    """Standard Webhooks receipts signed with a `whsec_` secret (docs/receipts.md)."""

    scheme: Literal["http"]
    secret_from: SecretSource = Field(alias="secretFrom")


class TwilioReceipts(_Strict):
    """Twilio status callbacks, signed with the account's auth token (`X-Twilio-Signature`)."""

    scheme: Literal["twilio"]
    auth_token_from: SecretSource = Field(alias="authTokenFrom")


class SendgridReceipts(_Strict):
    """SendGrid Event Webhook batches, signed with ECDSA; the verification key as PEM."""

    scheme: Literal["sendgrid"]
    public_key_file: Path = Field(alias="publicKeyFile")


class SesReceipts(_Strict):
    """Amazon SES events through SNS, verified against the topic's signing certificate (PEM),
    which is configured, never fetched from the URL a message names."""

    scheme: Literal["ses"]
    certificate_file: Path = Field(alias="certificateFile")


Receipts = Annotated[
    HttpReceipts | TwilioReceipts | SendgridReceipts | SesReceipts, Field(discriminator="scheme")
]


class ProviderSpec(_Strict):
    name: str
    type: Literal["http", "smtp", "simulated", "slack", "teams", "webhook", "pagerduty", "opsgenie"]
    channels: list[Channel]
    timeout_seconds: float = Field(10.0, alias="timeout", gt=0)
    rate_limit: RateLimit | None = Field(None, alias="rateLimit")
    # Every provider of a providers file has a breaker (these defaults unless set); the flags
    # shorthand keeps one provider per channel without one (see `specs_from_settings`).
    circuit_breaker: CircuitBreaker | None = Field(
        default_factory=CircuitBreaker, alias="circuitBreaker"
    )
    # http; the vendor types' endpoint (VENDOR_URLS when unset)
    url: str | None = None
    # slack, teams, webhook, pagerduty, opsgenie: destination name -> Slack channel id or
    # incoming-webhook URL, Teams or webhook URL, PagerDuty routing key, Opsgenie team
    destinations: dict[str, str | RoutingKey] = Field(default_factory=dict)
    token_from: SecretSource | None = Field(None, alias="tokenFrom")  # slack, opsgenie
    secret_from: SecretSource | None = Field(None, alias="secretFrom")  # webhook signing
    resolve_on_acknowledge: bool = Field(False, alias="resolveOnAcknowledge")  # pagerduty
    # All workers together, per destination; the vendor's published rate unless set.
    destination_rate_limit: RateLimit | None = Field(None, alias="destinationRateLimit")
    # smtp
    host: str | None = None
    port: int = Field(587, ge=1, le=65535)
    username: str | None = None
    password: str | None = Field(None, exclude=True, repr=False)
    password_from: SecretSource | None = Field(None, alias="passwordFrom")
    starttls: bool = False
    from_address: str = Field("notify-queue@localhost", alias="from")
    # simulated
    failure_rate: float = Field(0.0, alias="failureRate", ge=0, le=1)
    latency_ms: float = Field(0.0, alias="latencyMs", ge=0)
    # How its vendor reports deliveries, bounces and complaints to the API (docs/receipts.md).
    receipts: Receipts | None = None

    @field_validator("timeout_seconds", mode="before")
    @classmethod
    def _timeout(cls, value: object) -> float:
        return _duration_seconds(value)

    @model_validator(mode="after")
    def _complete(self) -> ProviderSpec:
        if not NAME.match(self.name):
            raise ValueError(f"provider name {self.name!r} must match [a-z0-9-]{{1,63}}")
        if not self.channels:
            raise ValueError(f"provider {self.name}: channels must not be empty")
        if self.type == "http" and not self.url:
            raise ValueError(f"provider {self.name}: type http needs url")
        if self.type in VENDOR_TYPES:
            self._vendor_complete()
        if self.type == "smtp":
            if not self.host:
                raise ValueError(f"provider {self.name}: type smtp needs host")
            if self.channels != [Channel.EMAIL]:
                others = ", ".join(c for c in self.channels if c is not Channel.EMAIL)
                raise ValueError(f"provider {self.name}: smtp delivers email only, not {others}")
        return self

    def _vendor_complete(self) -> None:
        serves = {"slack": {Channel.CHAT}, "teams": {Channel.CHAT}, "webhook": {Channel.WEBHOOK}}
        allowed = serves.get(self.type, {Channel.INCIDENT})
        others = [c for c in self.channels if c not in allowed]
        if others:
            raise ValueError(
                f"provider {self.name}: {self.type} delivers {', '.join(sorted(allowed))} only,"
                f" not {', '.join(others)}"
            )
        for destination, target in self.destinations.items():
            if not DESTINATION.match(destination):
                raise ValueError(
                    f"provider {self.name}: destination {destination!r} must match"
                    " [a-z0-9][-a-z0-9._#]{0,127}"
                )
            wants_key = self.type == "pagerduty"
            if isinstance(target, RoutingKey) != wants_key:
                shape = "{routingKeyFrom: {env: NAME}}" if wants_key else "a string"
                raise ValueError(f"provider {self.name}: destination {destination} must be {shape}")
            url_only = self.type in ("teams", "webhook")
            if url_only and not str(target).startswith(("https://", "http://")):
                raise ValueError(f"provider {self.name}: destination {destination} must be a URL")
        if self.type in ("slack", "opsgenie") and self.token_from is None:
            needs_token = self.type == "opsgenie" or any(
                not str(t).startswith(("https://", "http://")) for t in self.destinations.values()
            )
            if needs_token:
                raise ValueError(f"provider {self.name}: type {self.type} needs tokenFrom")
        if self.resolve_on_acknowledge and self.type != "pagerduty":
            raise ValueError(f"provider {self.name}: resolveOnAcknowledge is for pagerduty only")

    @property
    def endpoint(self) -> str:
        """Where a vendor type sends: `url`, else the vendor's public endpoint."""
        return self.url or VENDOR_URLS[self.type]

    @property
    def destination_rate(self) -> float | None:
        """Sends per second per destination, all workers together; None: no such limit."""
        if self.destination_rate_limit is not None:
            return self.destination_rate_limit.per_second
        return VENDOR_DESTINATION_RATES.get(self.type)

    def smtp_password(self) -> str | None:
        return self.password_from.read() if self.password_from is not None else self.password


class ProviderSpecs(_Strict):
    providers: Annotated[list[ProviderSpec], Field(min_length=1)]
    chains: dict[Channel, Annotated[list[str], Field(min_length=1)]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> ProviderSpecs:
        by_name = {p.name: p for p in self.providers}
        if len(by_name) != len(self.providers):
            raise ValueError("provider names must be unique")
        for channel, chain in self.chains.items():
            for name in chain:
                spec = by_name.get(name)
                if spec is None:
                    raise ValueError(f"chains.{channel}: unknown provider {name!r}")
                if channel not in spec.channels:
                    raise ValueError(f"chains.{channel}: provider {name!r} does not serve it")
            if len(set(chain)) != len(chain):
                raise ValueError(f"chains.{channel}: a provider is listed twice")
        return self

    def chain(self, channel: Channel) -> list[str]:
        """The failover order: the channel's chain, else every provider serving it, file order."""
        explicit = self.chains.get(channel)
        if explicit is not None:
            return list(explicit)
        return [p.name for p in self.providers if channel in p.channels]

    def missing_channels(self, channels: list[Channel]) -> list[Channel]:
        return [c for c in channels if not self.chain(c)]


def specs_from_settings(settings: WorkerSettings) -> ProviderSpecs:
    """A worker's providers: `--providers-file` if given, else one provider per kind the
    single-provider flags name; refused (one line) when a channel it serves has none.

    The shorthand has no circuit breaker and no rate limit: with one provider per channel there
    is nowhere to fail over to, and an outage is absorbed by backoff and dead-lettering exactly as
    before providers files existed. A providers file is how a breaker and limits are configured.
    """
    if settings.providers_file is not None:
        specs = load_provider_specs(settings.providers_file)
    else:
        specs = _specs_from_flags(settings)
    missing = specs.missing_channels(served_channels(settings, specs))
    if missing:
        raise ConfigurationError(
            [f"no provider serves {', '.join(missing)} (--channels, --providers-file)"]
        )
    return specs


def served_channels(settings: WorkerSettings, specs: ProviderSpecs) -> list[Channel]:
    """The channels a worker claims: `--channels` when given, else every channel but the
    optional ones no provider serves."""
    if "channels" in settings.model_fields_set:
        return list(settings.channels)
    return [c for c in settings.channels if c not in OPTIONAL_CHANNELS or specs.chain(c)]


def _specs_from_flags(settings: WorkerSettings) -> ProviderSpecs:
    # WorkerSettings has already refused flags that cannot work (smtp for sms, http without a
    # URL), so these specs validate; a failure here would be a bug, not bad input.
    kinds: dict[str, list[Channel]] = {}
    for channel, kind in settings.channel_providers.items():
        if channel in settings.channels:  # only what this worker serves must be deliverable
            kinds.setdefault(kind.value, []).append(channel)
    document = {
        "providers": [
            {
                "name": kind,
                "type": kind,
                "channels": channels,
                "timeout": settings.provider_timeout,
                "circuitBreaker": None,
                "url": settings.provider_url,
                "host": settings.smtp_host,
                "port": settings.smtp_port,
                "username": settings.smtp_username,
                "password": settings.smtp_password,
                "starttls": settings.smtp_starttls,
                "from": settings.smtp_from,
                "failureRate": settings.sim_failure_rate,
                "latencyMs": settings.sim_latency_ms,
            }
            for kind, channels in kinds.items()
        ]
    }
    return ProviderSpecs.model_validate(document)


def load_provider_specs(path: Path) -> ProviderSpecs:
    """Read and validate a providers file; one ConfigurationError line per problem."""
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigurationError([f"--providers-file: cannot read {path}: {exc}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigurationError([f"--providers-file: {path} is not valid YAML: {exc}"]) from None
    if not isinstance(document, dict):
        raise ConfigurationError([f"--providers-file: {path} must hold a mapping"])
    try:
        return ProviderSpecs.model_validate(document)
    except ValidationError as exc:
        raise ConfigurationError(
            [
                f"--providers-file: {'.'.join(map(str, e['loc'])) or path}: "
                + e["msg"].removeprefix("Value error, ")
                for e in exc.errors()
            ]
        ) from None
