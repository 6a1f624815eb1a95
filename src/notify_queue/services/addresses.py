"""Addresses in one spelling, before they are stored, limited, digested or suppressed.

`a@Example.COM` and `a@example.com` are one mailbox, so they must be one rate window, one digest
and one suppression; the queue compares addresses as text, so it stores each in one form
(docs/recipients.md, "Addresses"):

* email: the domain mapped and encoded by `idna` (UTS 46: lower case, then punycode, so
  `a@BÜCHER.example` is `a@xn--bcher-kva.example`); the local part is kept as written, since only
  the receiving server knows whether its case matters (`A@x` and `a@x` stay two addresses).
* sms and voice: E.164, parsed by `phonenumbers.parse` (a national number needs a default region)
  and written by `phonenumbers.format_number(..., E164)`. The number is parsed and formatted,
  not judged: `phonenumbers.is_valid_number` (the check against each country's numbering plan)
  is not called, so a number from a plan newer than the library is still accepted.
* every other channel (push tokens, chat, webhook and incident destination names): as written.

The SQL door cannot run these libraries; what notify_queue_enqueue does instead is in
docs/enqueue.md, "Addresses".
"""

from __future__ import annotations

import functools

import idna
import phonenumbers

from notify_queue.limits import (
    E164_MESSAGE,
    EMAIL_DOMAIN_MESSAGE,
    EMAIL_PATTERN,
    MAX_RECIPIENT_CHARS,
    SMS_PATTERN,
)
from notify_queue.models import Channel

EMAIL_MESSAGE = "must be an email address"
# What a written phone number may contain after its `+`: digits and the separators people
# type. Anything else (letters, "ext. 12") is refused rather than read by the parser's leniency.
_PHONE_CHARACTERS = frozenset("0123456789 -.()/\u00a0")


def normalise_address(channel: Channel, address: str, default_region: str | None) -> str:
    """`address` in the one form it is stored and compared in for `channel`; ValueError saying
    what is wrong (without the channel's name) when it has none."""
    if channel is Channel.EMAIL:
        return normalise_email(address)
    if channel in (Channel.SMS, Channel.VOICE):
        return normalise_phone(address, default_region)
    return address


def normalise_email(address: str) -> str:
    """The local part as written, `@`, the domain IDNA-encoded (UTS 46 mapping)."""
    if not EMAIL_PATTERN.fullmatch(address):
        raise ValueError(EMAIL_MESSAGE)
    local, _, domain = address.partition("@")
    normalised = f"{local}@{_encoded_domain(domain)}"
    if not EMAIL_PATTERN.fullmatch(normalised):  # a mapped dot may leave an empty last label
        raise ValueError(EMAIL_DOMAIN_MESSAGE)
    if len(normalised) > MAX_RECIPIENT_CHARS:
        raise ValueError(
            f"is {len(normalised)} characters with its domain IDNA-encoded; "
            f"the limit is {MAX_RECIPIENT_CHARS}"
        )
    return normalised


@functools.lru_cache(maxsize=4096)
def _encoded_domain(domain: str) -> str:
    # Cached: a queue's domains repeat (a few providers' and a company's own), and the mapping
    # and checks cost more than the rest of a create's validation.
    try:
        return idna.encode(domain, uts46=True).decode("ascii")
    except idna.IDNAError:
        raise ValueError(EMAIL_DOMAIN_MESSAGE) from None


# Cached: parsing is about 0.1 ms (twice per number, see below), a good part of a create's
# cost, and a queue sends to the same numbers again and again.
@functools.lru_cache(maxsize=4096)
def normalise_phone(number: str, default_region: str | None) -> str:
    """E.164: `+`, country code, national number. Without `default_region` the number must
    start with `+` (a national number could belong to any country)."""
    international = number.startswith("+")
    if not international and default_region is None:
        raise ValueError(E164_MESSAGE)
    wanted = (
        E164_MESSAGE
        if international
        else f"{E164_MESSAGE}, or a national number of region {default_region}"
    )
    if not set(number[1:] if international else number) <= _PHONE_CHARACTERS:
        raise ValueError(wanted)
    try:
        parsed = phonenumbers.parse(number, None if international else default_region)
    except phonenumbers.NumberParseException:
        raise ValueError(wanted) from None
    formatted = _e164(parsed)
    # The stored form must read back as itself. A national number that starts with its trunk
    # prefix twice would not (`+971 00 000000` formats as `+9710000000`, which parses again
    # without a 0): such a number is in no plan, and is refused rather than kept in two forms.
    if not SMS_PATTERN.fullmatch(formatted) or _e164(phonenumbers.parse(formatted)) != formatted:
        raise ValueError(wanted)
    return formatted


def _e164(number: phonenumbers.PhoneNumber) -> str:
    return phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)
