"""The vendor provider types in a providers file (docs/providers.md, "Chat, webhook and incident
providers"): what a valid entry becomes (the vendor's endpoint by default, its per-destination
rate) and the one line a wrong entry stops the worker with. Secrets are read from env or files
only, when the providers are built; an unset one is a configuration error, not a failed send.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from notify_queue.errors import ConfigurationError
from notify_queue.providers import build_providers
from notify_queue.providers.specs import (
    ProviderSpecs,
    load_provider_specs,
    served_channels,
    specs_from_settings,
)
from notify_queue.settings import WorkerSettings


def _load(tmp_path: Path, *providers: dict[str, Any]) -> ProviderSpecs:
    path = tmp_path / "providers.yaml"
    path.write_text(yaml.safe_dump({"providers": list(providers)}))
    return load_provider_specs(path)


def _refused(tmp_path: Path, provider: dict[str, Any]) -> str:
    with pytest.raises(ConfigurationError) as caught:
        _load(tmp_path, provider)
    return str(caught.value)


def test_vendor_endpoints_and_per_destination_rates_have_the_vendors_defaults(
    tmp_path: Path,
) -> None:
    specs = _load(
        tmp_path,
        {"name": "slack-main", "type": "slack", "channels": ["chat"],
         "tokenFrom": {"env": "T"}, "destinations": {"ops": "C0123ABC"}},
        {"name": "pd", "type": "pagerduty", "channels": ["incident"],
         "destinations": {"db-team": {"routingKeyFrom": {"file": "/run/pd"}}},
         "resolveOnAcknowledge": True},
        {"name": "og", "type": "opsgenie", "channels": ["incident"],
         "tokenFrom": {"env": "K"}, "destinations": {"db-team": "db"},
         "destinationRateLimit": {"perSecond": 5}},
        {"name": "teams-main", "type": "teams", "channels": ["chat"],
         "destinations": {"ops": "https://example.org/workflow"}},
        {"name": "hooks", "type": "webhook", "channels": ["webhook"],
         "destinations": {"ci": "https://ci.example/hook"}},
    )  # fmt: skip
    by_name = {p.name: p for p in specs.providers}
    assert by_name["slack-main"].endpoint == "https://slack.com/api"
    assert by_name["pd"].endpoint == "https://events.pagerduty.com/v2/enqueue"
    assert by_name["og"].endpoint == "https://api.opsgenie.com/v2/alerts"
    assert by_name["slack-main"].destination_rate == 1.0
    assert by_name["teams-main"].destination_rate == 4.0
    assert by_name["pd"].destination_rate == 2.0
    assert by_name["og"].destination_rate == 5.0
    assert by_name["hooks"].destination_rate is None


@pytest.mark.parametrize(
    ("provider", "message"),
    [
        (
            {"name": "s", "type": "slack", "channels": ["email"], "tokenFrom": {"env": "T"}},
            "slack delivers chat only, not email",
        ),
        (
            {"name": "s", "type": "slack", "channels": ["chat"], "destinations": {"ops": "C1"}},
            "type slack needs tokenFrom",
        ),
        (
            {"name": "o", "type": "opsgenie", "channels": ["incident"]},
            "type opsgenie needs tokenFrom",
        ),
        (
            {"name": "p", "type": "pagerduty", "channels": ["incident"],
             "destinations": {"db": "R0123"}},
            "destination db must be {routingKeyFrom",
        ),
        (
            {"name": "t", "type": "teams", "channels": ["chat"], "destinations": {"ops": "C1"}},
            "destination ops must be a URL",
        ),
        (
            {"name": "w", "type": "webhook", "channels": ["webhook"],
             "destinations": {"Not Valid": "https://x.example"}},
            "destination 'Not Valid' must match",
        ),
        (
            {"name": "o", "type": "opsgenie", "channels": ["incident"], "tokenFrom": {"env": "K"},
             "resolveOnAcknowledge": True},
            "resolveOnAcknowledge is for pagerduty only",
        ),
        (
            {"name": "s", "type": "slack", "channels": ["chat"], "tokenFrom": "xoxb-inline"},
            "tokenFrom",
        ),
    ],
)  # fmt: skip
def test_a_wrong_vendor_entry_is_refused_with_one_line(
    tmp_path: Path, provider: dict[str, Any], message: str
) -> None:
    assert message in _refused(tmp_path, provider)


async def test_an_unset_secret_stops_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NQ_TEST_UNSET_TOKEN", raising=False)
    specs = _load(
        tmp_path,
        {"name": "og", "type": "opsgenie", "channels": ["incident"],
         "tokenFrom": {"env": "NQ_TEST_UNSET_TOKEN"}, "destinations": {"db-team": "db"}},
    )  # fmt: skip
    async with aiohttp.ClientSession() as session:
        with pytest.raises(ConfigurationError, match="NQ_TEST_UNSET_TOKEN unset"):
            build_providers(specs, session)


def test_without_channels_a_worker_serves_the_optional_channels_only_where_a_provider_does(
    tmp_path: Path,
) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(
        yaml.safe_dump(
            {"providers": [{"name": "all", "type": "simulated",
                            "channels": ["email", "sms", "push", "voice", "incident"]}]}
        )
    )  # fmt: skip
    settings = WorkerSettings(database_url="postgresql://x/y", providers_file=path)
    specs = specs_from_settings(settings)
    served = served_channels(settings, specs)
    assert served == ["email", "sms", "push", "voice", "incident"]
    explicit = WorkerSettings(
        database_url="postgresql://x/y", providers_file=path, channels=["email", "chat"]
    )
    with pytest.raises(ConfigurationError, match="no provider serves chat"):
        specs_from_settings(explicit)
