"""JSON text in and out of the create path, by orjson, with the standard library's exact answers.

The API's create path parsed and wrote JSON with the standard library, a large share of the
API's CPU on a batch (docs/performance.md). orjson does both in C, several times faster, and is
what FastAPI and Starlette users reach for; it is used where it gives the same result, and the
standard library decides everything else:

- `loads`: orjson reads integers beyond 64 bits as floats (the standard library keeps them whole,
  and a request's hash and stored metadata depend on it) and refuses a few things the standard
  library takes (an escaped unpaired surrogate, which the API names as a bad field; nesting
  deeper than orjson's limit). A body with a number of 19 digits, or one orjson refuses, is
  parsed by the standard library, so every answer, error message included, is the one it always
  was.
- `canonical`: the text a request's hash is taken over, byte for byte what
  `json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)` gives (hashes
  stored by earlier releases must still match). orjson writes the same bytes for everything but
  floats (`1e+16` against `1e16`), so a value holding a float goes to the standard library.
- `dumps`: the compact text Starlette's `JSONResponse` writes (no spaces, UTF-8 unescaped).
  orjson refuses a few values (an unpaired surrogate, which a batch item's unknown field name can
  carry into its error; an integer beyond 64 bits); those go through the standard library with
  ASCII escapes, which is valid JSON whatever the strings hold.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import orjson

# A number of 19 digits or more may not fit 64 bits: orjson would read it as a float. A number
# token starts the text or follows `[`, `:` or `,` (whitespace and its sign between), which digits
# inside a string rarely do: a key or an address with 19 digits in a row (a hex uuid holds such a
# run one time in 1,000) stays orjson's. So every digit becomes "0", `[` and `:` become ",",
# whitespace and "-" go (no number holds whitespace; merged text inside a string can only send
# more bodies to the fallback), and one search finds "," and nineteen zeros: all in C, where a
# regular expression tried its pattern at each byte of a batch.
_NUMBERS_AS_ZEROS = bytes.maketrans(b"123456789[:", b"000000000,,")
_NOT_IN_A_NUMBER_TOKEN = b" \t\r\n-"
_NINETEEN_DIGITS = b"0" * 19
_LATER_NUMBER = b"," + _NINETEEN_DIGITS


def _has_long_number(raw: bytes) -> bool:
    """Whether `raw` holds a number token of 19 digits or more (or, rarely, a string that looks
    like one: the fallback then decides, exactly as for a number)."""
    text = raw.translate(_NUMBERS_AS_ZEROS, _NOT_IN_A_NUMBER_TOKEN)
    return text.startswith(_NINETEEN_DIGITS) or _LATER_NUMBER in text


def loads(raw: bytes, *, fallback: Callable[[str], Any]) -> Any:
    """The JSON value of `raw` (UTF-8); `fallback(text)` decides when orjson cannot be exact."""
    if not _has_long_number(raw):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # the standard library decides, with its own message
    return fallback(raw.decode("utf-8"))


def canonical(value: Any) -> bytes:
    """Sorted keys, no spaces, UTF-8 unescaped: the standard library's exact bytes."""
    if _floatless(value):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except (orjson.JSONEncodeError, TypeError):
            pass  # an unpaired surrogate, an integer beyond 64 bits
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", errors="surrogatepass")


def _floatless(value: Any) -> bool:
    kind = type(value)
    if kind is dict:
        values = value.values()
    elif kind is list:
        values = value
    else:
        return kind is not float
    # A loop, not a call per member: a request's members are mostly text (a third of the hash's
    # cost went to a generator and a call for each).
    for member in values:
        member_kind = type(member)
        if member_kind is float:
            return False
        if (member_kind is dict or member_kind is list) and not _floatless(member):
            return False
    return True


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON text, as `json.dumps(value, separators=(",", ":"))` means it; an aware
    datetime is written as RFC 3339 (`datetime.isoformat()`), a UUID as `str(uuid)` (orjson
    writes both in C, where `str()` of a UUID is Python, twice per created notification)."""
    try:
        return orjson.dumps(value)
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(value, allow_nan=False, separators=(",", ":"), default=_text).encode()


def _text(value: Any) -> str:
    # What orjson writes itself; the fallback must write it the same way.
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def dumps_text(value: Any) -> str:
    """`dumps` as a str, for a driver parameter."""
    return dumps(value).decode()
