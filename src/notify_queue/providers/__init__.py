"""Providers: the code that hands a notification to the outside world.

`build_providers` turns the named provider specs (a providers file, or the single-provider flags)
into one instance per name. HTTP providers share the one session the caller passes (its
connection pool); that session is the trusted one, since provider URLs are the operator's own.
"""

from __future__ import annotations

import aiohttp

from notify_queue.providers.base import DeliveryRequest, Provider
from notify_queue.providers.http import HttpProvider
from notify_queue.providers.opsgenie import OpsgenieProvider
from notify_queue.providers.outbound import OutboundRefused, trusted_session
from notify_queue.providers.pagerduty import PagerDutyProvider
from notify_queue.providers.posting import guarded_poster, trusted_poster
from notify_queue.providers.simulated import SimulatedProvider
from notify_queue.providers.slack import SlackProvider
from notify_queue.providers.smtp import SmtpProvider
from notify_queue.providers.specs import ProviderSpec, ProviderSpecs, RoutingKey
from notify_queue.providers.teams import TeamsProvider
from notify_queue.providers.vendor import JsonPoster
from notify_queue.providers.webhook import WebhookProvider
from notify_queue.providers.webhooks import WebhookSender

__all__ = [
    "DeliveryRequest",
    "HttpProvider",
    "OpsgenieProvider",
    "OutboundRefused",
    "PagerDutyProvider",
    "Provider",
    "SimulatedProvider",
    "SlackProvider",
    "SmtpProvider",
    "TeamsProvider",
    "WebhookProvider",
    "WebhookSender",
    "build_providers",
    "guarded_poster",
    "trusted_poster",
    "trusted_session",
]


def build_providers(specs: ProviderSpecs, session: aiohttp.ClientSession) -> dict[str, Provider]:
    """One provider per spec, by name. The caller closes each, then the session."""
    return {spec.name: _build(spec, session) for spec in specs.providers}


def _build(spec: ProviderSpec, session: aiohttp.ClientSession) -> Provider:
    if spec.type == "simulated":
        return SimulatedProvider(
            failure_rate=spec.failure_rate,
            latency_ms=spec.latency_ms,
            timeout_seconds=spec.timeout_seconds,
        )
    if spec.type == "http":
        assert spec.url is not None  # ProviderSpec refuses an http provider without url
        return HttpProvider(spec.url, spec.timeout_seconds, session)
    if spec.type != "smtp":
        return _build_vendor(spec, session)
    assert spec.host is not None  # ProviderSpec refuses an smtp provider without host
    return SmtpProvider(
        host=spec.host,
        port=spec.port,
        username=spec.username,
        password=spec.smtp_password(),
        starttls=spec.starttls,
        from_address=spec.from_address,
        timeout_seconds=spec.timeout_seconds,
    )


def _build_vendor(spec: ProviderSpec, session: aiohttp.ClientSession) -> Provider:
    """slack, teams, webhook, pagerduty, opsgenie: secrets read once, at start (a missing one
    stops the worker with one line)."""
    plain = {name: t for name, t in spec.destinations.items() if isinstance(t, str)}
    poster = JsonPoster(session, spec.timeout_seconds)
    token = spec.token_from.read() if spec.token_from is not None else None
    if spec.type == "slack":
        return SlackProvider(
            spec.name, url=spec.endpoint, token=token, destinations=plain, poster=poster
        )
    if spec.type == "teams":
        return TeamsProvider(spec.name, destinations=plain, poster=poster)
    if spec.type == "webhook":
        secret = spec.secret_from.read() if spec.secret_from is not None else None
        return WebhookProvider(spec.name, destinations=plain, secret=secret, poster=poster)
    if spec.type == "pagerduty":
        keys = {
            name: t.routing_key_from.read()
            for name, t in spec.destinations.items()
            if isinstance(t, RoutingKey)
        }
        return PagerDutyProvider(
            spec.name,
            url=spec.endpoint,
            routing_keys=keys,
            resolve_on_acknowledge=spec.resolve_on_acknowledge,
            poster=poster,
        )
    assert token is not None  # ProviderSpec requires tokenFrom for opsgenie
    return OpsgenieProvider(spec.name, url=spec.endpoint, api_key=token, teams=plain, poster=poster)
