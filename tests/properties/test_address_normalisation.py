"""Normalised addresses (services/addresses.py) are a fixed point: normalising the stored form
again gives it back, so an address stored by one door and sent again through another is the
same text (one rate window, one digest, one suppression). Generated addresses: email with
mixed-case, international and punycode domains; phone numbers written with the separators
people type, with and without a default region; every other channel's text."""

from __future__ import annotations

import phonenumbers
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from notify_queue.limits import EMAIL_PATTERN, SMS_PATTERN
from notify_queue.models import Channel
from notify_queue.services.addresses import normalise_address
from tests.properties.conftest import examples

LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
label_text = st.text(
    alphabet=st.sampled_from(LETTERS + "0123456789-äöüßéÜÉçñøåЖжλΛ中文"), min_size=1, max_size=20
)
domains = st.builds(
    ".".join,
    st.lists(label_text, min_size=1, max_size=3).map(lambda ls: [*ls, "example"]),
)
locals_ = st.text(alphabet=st.sampled_from(LETTERS + "0123456789._+-"), min_size=1, max_size=20)
emails = st.builds(lambda local, domain: f"{local}@{domain}", locals_, domains)
regions = st.sampled_from(sorted(phonenumbers.SUPPORTED_REGIONS))
separators = st.sampled_from(["", " ", "-", ".", " (", ") "])
digit_groups = st.lists(st.text(alphabet="0123456789", min_size=1, max_size=4), max_size=5)
phones = st.builds(
    lambda plus, groups, seps: (
        ("+" if plus else "")
        + "".join(g + s for g, s in zip(groups, seps + [""] * len(groups), strict=False))
    ),
    st.booleans(),
    digit_groups.filter(lambda g: sum(map(len, g)) >= 4),
    st.lists(separators, max_size=5),
)


def _normalised(channel: Channel, address: str, region: str | None) -> str:
    try:
        return normalise_address(channel, address, region)
    except ValueError:
        assume(False)
        raise  # unreachable: assume(False) stops the example


@settings(max_examples=examples(300), deadline=None)
@given(address=emails)
def test_an_email_normalised_again_is_unchanged(address: str) -> None:
    once = _normalised(Channel.EMAIL, address, None)
    assert normalise_address(Channel.EMAIL, once, None) == once
    assert EMAIL_PATTERN.fullmatch(once) and once.isascii()
    local, _, domain = once.partition("@")
    assert local == address.partition("@")[0]
    assert domain == domain.lower() and domain.isascii()


@settings(max_examples=examples(300), deadline=None)
@given(
    number=phones, region=st.none() | regions, channel=st.sampled_from([Channel.SMS, Channel.VOICE])
)
def test_a_phone_number_normalised_again_is_unchanged(
    number: str, region: str | None, channel: Channel
) -> None:
    once = _normalised(channel, number, region)
    assert SMS_PATTERN.fullmatch(once)
    # The stored form reads the same with any region or none: it carries its country code.
    assert normalise_address(channel, once, None) == once
    assert normalise_address(channel, once, region) == once


@settings(max_examples=examples(100), deadline=None)
@given(
    channel=st.sampled_from([Channel.PUSH, Channel.CHAT, Channel.WEBHOOK, Channel.INCIDENT]),
    text=st.text(min_size=1, max_size=40),
)
def test_every_other_channel_keeps_its_address_as_written(channel: Channel, text: str) -> None:
    assert normalise_address(channel, text, "GB") == text
