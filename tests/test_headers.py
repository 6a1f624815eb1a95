"""Which header values are refused (`notify_queue.headers`): every control character but TAB and
the Unicode line separators, typed plainly or inside an RFC 2047 encoded word, and nothing else."""

from __future__ import annotations

import sys
import unicodedata

import pytest

from notify_queue.headers import header_value_problem

REFUSED = [
    chr(i)
    for i in range(sys.maxunicode + 1)
    if unicodedata.category(chr(i)) == "Cc" and chr(i) != "\t"
] + ["\u2028", "\u2029"]


def test_every_control_character_but_tab_and_the_line_separators_are_refused() -> None:
    assert len(REFUSED) == 66
    for char in REFUSED:
        problem = header_value_problem(f"a{char}b")
        assert problem is not None and f"U+{ord(char):04X}" in problem


@pytest.mark.parametrize(
    "value",
    ["=?utf-8?q?a=0Db?=", "=?utf-8?b?YQpi?=", "x =?iso-8859-1?q?a=85b?=", "=?utf-8?q?a=E2=80=A9?="],
)
def test_an_encoded_word_decoding_to_a_line_break_is_refused(value: str) -> None:
    problem = header_value_problem(value)
    assert problem is not None and "encoded word" in problem


@pytest.mark.parametrize(
    "value",
    [
        "Your receipt",
        "a\ttab",
        "Grüße, 東京, \u00a0\u200b",
        "=?utf-8?q?caf=C3=A9?=",
        "=?utf-8?q?not closed",
        "=?unknown-charset?q?x?=",
        "=?" * 500,
    ],
)
def test_text_on_one_line_is_accepted(value: str) -> None:
    assert header_value_problem(value) is None
