"""The create request's limits and patterns have one source, notify_queue.limits: the API's
validation imports them and `migrate` writes them into the enqueue function's text
(`{{limit:NAME}}`), so one edit changes both doors."""

from __future__ import annotations

import pytest

from notify_queue import limits
from notify_queue.models import Channel
from notify_queue.repositories.schema import function_sources, render_function
from notify_queue.services import addresses


def test_every_placeholder_of_the_function_files_is_filled() -> None:
    for name, text in function_sources().items():
        assert "{{" not in text, name


def test_the_enqueue_function_checks_the_channels_and_patterns_of_the_api() -> None:
    text = function_sources()["nq_enqueue_errors"]
    assert "(" + ", ".join(f"'{c.value}'" for c in Channel) + ")" in text
    assert f"'{limits.SMS_PATTERN.pattern}'" in text
    assert f"> {limits.MAX_RECIPIENT_CHARS} THEN" in text
    for message in ("E164_MESSAGE", "EMAIL_DOMAIN_MESSAGE", "EMAIL_ASCII_DOMAIN_MESSAGE"):
        assert getattr(limits, message) in text, message
    # The API's address rules read the same module.
    assert addresses.SMS_PATTERN is limits.SMS_PATTERN
    assert addresses.EMAIL_DOMAIN_MESSAGE is limits.EMAIL_DOMAIN_MESSAGE


def test_a_changed_limit_changes_the_function_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_RECIPIENT_CHARS", 321)
    monkeypatch.setattr(limits, "CHANNELS", (*limits.CHANNELS, "fax"))
    monkeypatch.setattr(limits, "CHANNEL_MESSAGE", "Input should be 'email' or 'fax'")
    text = render_function(
        "SELECT {{limit:MAX_RECIPIENT_CHARS}}, x IN ({{limit:CHANNELS}}),"
        " '{{limit:CHANNEL_MESSAGE}}'"
    )
    listed = ", ".join(f"'{c.value}'" for c in Channel)
    assert text.startswith(f"SELECT 321, x IN ({listed}, 'fax'), ")
    assert text.endswith("'Input should be ''email'' or ''fax'''")


def test_an_unknown_limit_is_an_error() -> None:
    with pytest.raises(AttributeError):
        render_function("{{limit:NO_SUCH_LIMIT}}")
