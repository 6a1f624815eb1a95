"""Bad input is rejected before it reaches the queue, with every bad field named."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from notify_queue.errors import ValidationFailed
from notify_queue.services.validation import parse_request, request_hash, to_new_notification

NOW = datetime(2026, 9, 24, 12, 0, tzinfo=UTC)


def _fields(data: object) -> dict[str, str]:
    with pytest.raises(ValidationFailed) as caught:
        request = parse_request(data)
        to_new_notification(request, idempotency_key="k", request_digest="h", now=NOW)
    return {e.field: e.message for e in caught.value.errors}


def _ok(**extra: object) -> dict[str, object]:
    return {"channel": "email", "recipient": "a@example.com", "body": "hi", **extra}


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (_ok(channel="fax"), "channel"),
        (_ok(recipient=""), "recipient"),
        (_ok(recipient="x" * 321), "recipient"),
        (_ok(recipient="not-an-address"), "recipient"),
        ({"channel": "sms", "recipient": "0151 1234", "body": "x"}, "recipient"),
        ({"channel": "sms", "recipient": "+1234567", "body": "x"}, "recipient"),
        (_ok(body=""), "body"),
        (_ok(body="é" * 32_769), "body"),
        (_ok(subject="s" * 999), "subject"),
        (_ok(priority="URGENT"), "priority"),
        (_ok(sendAt="tomorrow"), "sendAt"),
        (_ok(sendAt="2026-09-24T12:00:00"), "sendAt"),
        (_ok(sendAt="2026-09-24T12:00:00Z", delaySeconds=5), "sendAt"),
        (_ok(delaySeconds=-1), "delaySeconds"),
        (_ok(delaySeconds=365 * 86400 + 1), "delaySeconds"),
        (_ok(expiresAt="2026-09-24T11:00:00Z"), "expiresAt"),
        (_ok(webhookUrl="ftp://x"), "webhookUrl"),
        (_ok(policy="Not A Policy"), "policy"),
        (_ok(metadata={"k": "v" * 16_400}), "metadata"),
        (_ok(metadata=[1, 2]), "metadata"),
        (_ok(unknown=1), "unknown"),
        (_ok(idempotencyKey="has space"), "idempotencyKey"),
    ],
)
def test_each_invalid_field_is_rejected_by_name(data: dict[str, object], field: str) -> None:
    assert field in _fields(data)


def test_several_bad_fields_are_all_named_at_once() -> None:
    assert {"channel", "body", "extra"} <= set(
        _fields({"channel": "x", "recipient": "r", "body": "", "extra": 1})
    )


def test_limits_are_inclusive() -> None:
    request = parse_request(
        _ok(body="b" * 65_536, subject="s" * 998, recipient=("a" * 300) + "@example.com")
    )
    assert len(request.body) == 65_536
    with pytest.raises(ValidationFailed):
        parse_request(_ok(body="b" * 65_537))


def test_delay_seconds_resolves_against_now_and_the_hash_is_of_the_request_as_sent() -> None:
    data = _ok(delaySeconds=90)
    new = to_new_notification(
        parse_request(data), idempotency_key="k", request_digest=request_hash(data), now=NOW
    )
    assert (new.send_at - NOW).total_seconds() == 90
    assert request_hash(data) == request_hash(dict(reversed(list(data.items()))))
    assert request_hash(data) == request_hash({**data, "idempotencyKey": "other"})
    assert request_hash(data) != request_hash(_ok(delaySeconds=91))


@pytest.mark.parametrize(
    ("channel", "written", "region", "stored"),
    [
        ("email", "Ann@Example.COM", None, "Ann@example.com"),
        ("email", "a@BÜCHER.example", None, "a@xn--bcher-kva.example"),
        ("sms", "+44 20 7946 0958", None, "+442079460958"),
        ("sms", "020 7946 0958", "GB", "+442079460958"),
        ("voice", "(030) 123456", "DE", "+4930123456"),
        ("push", "Tok En", "GB", "Tok En"),
    ],
)
def test_a_recipient_is_normalised_before_it_is_stored(
    channel: str, written: str, region: str | None, stored: str
) -> None:
    data = {"channel": channel, "recipient": written, "body": "hi"}
    request = parse_request(data, default_region=region)
    new = to_new_notification(request, idempotency_key="k", request_digest="h", now=NOW)
    assert new.recipient == stored


@pytest.mark.parametrize(
    ("channel", "written", "region"),
    [
        ("email", "a@exa_mple.com", None),
        ("email", "a@" + "b" * 64 + ".example", None),
        ("sms", "020 7946 0958", None),
        ("sms", "+44 20 7946 0958 ext. 12", "GB"),
        ("sms", "CALL-ME-NOW", "US"),
        ("voice", "+999 1234 5678", None),
    ],
)
def test_an_address_that_cannot_be_normalised_is_named(
    channel: str, written: str, region: str | None
) -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse_request(
            {"channel": channel, "recipient": written, "body": "x"}, default_region=region
        )
    assert [e.field for e in caught.value.errors] == ["recipient"]
    assert caught.value.errors[0].message.endswith(f"for channel {channel}")
