"""Header values we build from client data: one line of text, whatever the Python.

A header value holding a line break becomes a header of its own when the message is written
out. CR and LF typed plainly are the obvious way; the other is an RFC 2047 encoded word
(`=?utf-8?q?x=0D=0AReply-To:_a@b?=`), which the email package decodes when the header is set and
then, on Pythons before 3.11.10 / 3.12.5 (CVE-2024-6923), writes back out with the line break
as it is. So a value is refused when it, or any encoded word in it, holds a control character
(TAB, which headers may fold with, excepted) or a Unicode line or paragraph separator.
Checked at the API's door and again where a message is built (docs/security.md).
"""

from __future__ import annotations

import email.errors
import email.policy
import re

# Whether this Python's email package refuses, while writing a message, a header that would break
# its line (3.11.10+, 3.12.5+: CVE-2024-6923). Without it only the checks here stand in between;
# a worker says so when it starts (docs/security.md).
GENERATED_HEADERS_VERIFIED = hasattr(email.policy.default, "verify_generated_headers")

# Unicode's control characters (category Cc: U+0000-U+001F, U+007F-U+009F) but TAB, and the line
# and paragraph separators, at which `str.splitlines` breaks lines too. One character class: linear.
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


def header_value_problem(value: str) -> str | None:
    """Why `value` cannot be a header value, or None when it can."""
    bad = _first_unsafe(value)
    if bad is not None:
        return f"must not hold control characters or line separators ({_name(bad)})"
    if "=?" in value:
        # The email package's own reading of the value: what it would write back out.
        try:
            decoded = str(email.policy.default.header_factory("Subject", value))
        except (email.errors.MessageError, ValueError, LookupError):
            return "holds an encoded word that cannot be decoded"
        bad = _first_unsafe(decoded)
        if bad is not None:
            return f"must not hold an encoded word decoding to a control character ({_name(bad)})"
    return None


def _first_unsafe(text: str) -> str | None:
    found = _UNSAFE.search(text)
    return None if found is None else found.group()


def _name(char: str) -> str:
    return f"U+{ord(char):04X}"
