"""Providers: the code that hands a notification to the outside world, one kind per channel.

`build_providers` turns the settings into a channel -> provider map with one instance per kind,
shared by every channel that uses it: a simulated provider shared by email and sms remembers
the keys of both, and an HTTP provider shares the one guarded session (its connection pool).
"""

from __future__ import annotations

import aiohttp

from notify_queue.errors import ConfigurationError
from notify_queue.models import Channel
from notify_queue.providers.base import DeliveryRequest, Provider
from notify_queue.providers.http import HttpProvider
from notify_queue.providers.outbound import OutboundRefused, outbound_session, trusted_session
from notify_queue.providers.simulated import SimulatedProvider
from notify_queue.providers.smtp import SmtpProvider
from notify_queue.providers.webhooks import WebhookSender
from notify_queue.settings import ProviderKind, Settings

__all__ = [
    "DeliveryRequest",
    "HttpProvider",
    "OutboundRefused",
    "Provider",
    "SimulatedProvider",
    "SmtpProvider",
    "WebhookSender",
    "build_providers",
    "outbound_session",
    "trusted_session",
]


def build_providers(settings: Settings, session: aiohttp.ClientSession) -> dict[Channel, Provider]:
    """One provider per kind in use, keyed by every channel that uses it.

    `session` should come from `trusted_session` (the provider URL is the operator's own
    choice, not a client's); the HTTP provider borrows it and the caller
    closes it. Close each distinct provider once (`set(providers.values())`).
    """
    by_kind: dict[ProviderKind, Provider] = {}
    providers: dict[Channel, Provider] = {}
    for channel, kind in settings.channel_providers.items():
        if kind not in by_kind:
            by_kind[kind] = _build(kind, settings, session)
        providers[channel] = by_kind[kind]
    return providers


def _build(kind: ProviderKind, settings: Settings, session: aiohttp.ClientSession) -> Provider:
    if kind is ProviderKind.SIMULATED:
        return SimulatedProvider(
            failure_rate=settings.sim_failure_rate,
            latency_ms=settings.sim_latency_ms,
            timeout_seconds=settings.provider_timeout,
        )
    if kind is ProviderKind.HTTP:
        # Settings already refuse this combination; the check keeps the type honest.
        if not settings.provider_url:
            raise ConfigurationError(["the http provider needs --provider-url"])
        return HttpProvider(settings.provider_url, settings.provider_timeout, session)
    if not settings.smtp_host:
        raise ConfigurationError(["the smtp provider needs --smtp-host"])
    return SmtpProvider(
        host=settings.smtp_host,
        port=settings.smtp_port,
        username=settings.smtp_username,
        password=settings.smtp_password,
        starttls=settings.smtp_starttls,
        from_address=settings.smtp_from,
        timeout_seconds=settings.provider_timeout,
    )
