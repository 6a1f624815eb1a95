"""Providers: the code that hands a notification to the outside world.

`build_providers` turns the named provider specs (a providers file, or the single-provider flags)
into one instance per name. HTTP providers share the one session the caller passes (its
connection pool); that session is the trusted one, since provider URLs are the operator's own.
"""

from __future__ import annotations

import aiohttp

from notify_queue.providers.base import DeliveryRequest, Provider
from notify_queue.providers.http import HttpProvider
from notify_queue.providers.outbound import OutboundRefused, trusted_session
from notify_queue.providers.posting import guarded_poster, trusted_poster
from notify_queue.providers.simulated import SimulatedProvider
from notify_queue.providers.smtp import SmtpProvider
from notify_queue.providers.specs import ProviderSpec, ProviderSpecs
from notify_queue.providers.webhooks import WebhookSender

__all__ = [
    "DeliveryRequest",
    "HttpProvider",
    "OutboundRefused",
    "Provider",
    "SimulatedProvider",
    "SmtpProvider",
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
