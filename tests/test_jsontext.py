"""JSON text by orjson gives the standard library's answers (`notify_queue.jsontext`).

The create path parses bodies, hashes requests and writes answers with orjson; a request's hash
is compared with hashes stored by earlier releases, so its bytes must be the standard library's
exactly, and a parsed body must be the value the standard library would have read.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from notify_queue import jsontext

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()  # beyond 64 bits too: orjson would read those as floats
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()  # unpaired surrogates and control characters too
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def _stdlib_canonical(value: Any) -> bytes:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", errors="surrogatepass")


@settings(max_examples=200, deadline=None)
@given(_values)
def test_the_canonical_text_is_the_standard_librarys_byte_for_byte(value: Any) -> None:
    assert jsontext.canonical(value) == _stdlib_canonical(value)


@settings(max_examples=200, deadline=None)
@given(_values)
def test_a_body_reads_as_the_standard_library_reads_it(value: Any) -> None:
    raw = json.dumps(value).encode()  # ASCII escapes: any value, surrogates included
    parsed = jsontext.loads(raw, fallback=json.loads)
    assert json.dumps(parsed) == json.dumps(json.loads(raw))  # types and digits kept (int vs float)


@settings(max_examples=200, deadline=None)
@given(_values)
def test_written_text_reads_back_as_the_value(value: Any) -> None:
    assert json.loads(jsontext.dumps(value)) == value


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": 123456789012345678901234567890}',
        b'{"a": -9223372036854775809}',
        b'{"a": "\\ud800"}',
        b'{"a": NaN}',
        b'{"a": 1e400}',
        b"\xef\xbb\xbf{}",
        b"[1,]",
    ],
)
def test_what_orjson_cannot_read_exactly_is_the_fallbacks_to_decide(raw: bytes) -> None:
    seen: list[str] = []

    def fallback(text: str) -> Any:
        seen.append(text)
        return "decided by the fallback"

    assert jsontext.loads(raw, fallback=fallback) == "decided by the fallback"
    assert seen == [raw.decode()]


def test_plain_json_is_read_by_orjson_with_the_same_value() -> None:
    def fallback(text: str) -> Any:
        raise AssertionError("orjson reads this exactly")

    raw = b'{"channel":"email","n":12345678901234567,"x":1.5,"m":{"k":[true,null]}}'
    assert jsontext.loads(raw, fallback=fallback) == json.loads(raw)


def test_answers_stay_valid_json_with_an_unpaired_surrogate_in_a_field_name() -> None:
    # A batch item's unknown field can be named with one; its 400 result echoes the name.
    text = jsontext.dumps({"errors": [{"field": "\ud800", "message": "is not a field"}]})
    assert json.loads(text) == {"errors": [{"field": "\ud800", "message": "is not a field"}]}


def test_aware_times_are_written_as_isoformat_writes_them_with_or_without_orjson() -> None:
    moment = datetime(2026, 9, 24, 12, 0, 3, 4, tzinfo=timezone(timedelta(hours=2)))
    whole = datetime(2026, 9, 24, 12, tzinfo=UTC)
    assert json.loads(jsontext.dumps([moment, whole])) == [moment.isoformat(), whole.isoformat()]
    # The standard library's path (a value orjson refuses) writes them the same way.
    assert json.loads(jsontext.dumps([moment, "\ud800"])) == [moment.isoformat(), "\ud800"]


def test_uuids_are_written_as_str_writes_them_with_or_without_orjson() -> None:
    made = uuid.UUID("0190f0e2-7c4a-7b3e-9f00-0123456789ab")
    assert jsontext.dumps([made]) == b'["0190f0e2-7c4a-7b3e-9f00-0123456789ab"]'
    # The standard library's path (a value orjson refuses) writes it the same way.
    assert json.loads(jsontext.dumps([made, "\ud800"])) == [str(made), "\ud800"]


@pytest.mark.parametrize(
    "raw",
    [
        b"1234567890123456789012",
        b" \n-1234567890123456789012",
        b"[1,1234567890123456789012]",
        b'{"a":[ 1234567890123456789012]}',
        b'{"a": -1234567890123456789012}',
        b'{"a":1,\t"b":1234567890123456789012.5}',
    ],
)
def test_every_long_number_goes_to_the_fallback(raw: bytes) -> None:
    assert jsontext.loads(raw, fallback=lambda text: "decided by the fallback") == (
        "decided by the fallback"
    )


def test_long_digit_runs_inside_strings_stay_with_orjson() -> None:
    # A hex uuid holds 19 digits in a row one time in about 1,000: a batch of 500 keys would
    # otherwise go to the standard library's parser more often than not.
    raw = b'{"idempotencyKey": "a-1234567890123456789012ab", "x": ["-12345678901234567890"]}'

    def fallback(text: str) -> Any:
        raise AssertionError("read by the fallback")

    assert jsontext.loads(raw, fallback=fallback) == json.loads(raw)
