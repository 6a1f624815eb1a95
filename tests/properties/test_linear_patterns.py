"""Every regular expression of the project matches in time linear in its input.

Python's `re` backtracks: a pattern with two overlapping loops in a row (the old `webhookUrl`
pattern, `[^\\s/?#]+[^\\s]*`) took quadratic time on a long URL it finally rejected, and a batch
of such URLs stalled the API's event loop for seconds. Wall-clock time cannot prove the absence
of that on a shared machine, and a ratio of timings is noise; so the proof here is structural
and the measure is counted (tests/properties/regex_paths.py):

- a static check of each pattern's position automaton: no state loops on one string in two
  ways (exponential), no two states loop on one string that also leads from one to the other
  (polynomial). Without either, the ways to match any input are bounded: linear time.
- a property test: Hypothesis builds long adversarial inputs from each pattern's own
  characters (the ones its loops take, then one it must reject), and a backtracking matcher
  over the same automaton counts the edges it takes, as `re` would, to reject them: at most a
  constant per character.

Both are shown able to fail on known backtracking patterns (the old `webhookUrl` one, `(a+)+`).
The patterns are collected from the source, not listed by hand: every string literal given to
`re.compile`/`re.fullmatch`/`re.match`/`re.search`/`re.sub`/`re.findall` and every `pattern=`
of a pydantic field under src/notify_queue, and every `pattern:` of the CRDs (the kube-apiserver
checks those with Go's RE2, linear by construction, but the operator may check them again here).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.properties.conftest import examples
from tests.properties.regex_paths import ambiguity, automaton, backtracking_steps, contains

SOURCE = Path(__file__).parents[2] / "src" / "notify_queue"
_RE_CALLS = {"compile", "fullmatch", "match", "search", "sub", "subn", "findall", "split"}
OLD_WEBHOOK_URL_PATTERN = r"^https?://[^\s/?#]+[^\s]*$"


def _flags(node: ast.Call) -> int:
    """The flags a call passes by name (`re.IGNORECASE | re.MULTILINE`), as a number."""
    flags = 0
    for sub in ast.walk(ast.Module(body=[ast.Expr(a) for a in node.args[1:]], type_ignores=[])):
        if isinstance(sub, ast.Attribute) and isinstance(getattr(re, sub.attr, None), re.RegexFlag):
            flags |= getattr(re, sub.attr)
    for keyword in node.keywords:
        if keyword.arg == "flags":
            for sub in ast.walk(keyword.value):
                if isinstance(sub, ast.Attribute):
                    flags |= getattr(re, sub.attr, 0)
    return flags


def source_patterns() -> dict[str, tuple[str, int]]:
    """Every literal pattern under src/notify_queue: `file:line` -> (pattern, flags)."""
    found: dict[str, tuple[str, int]] = {}
    for path in sorted(SOURCE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            where = f"{path.relative_to(SOURCE)}:{node.lineno}"
            func = node.func
            is_re = (
                isinstance(func, ast.Attribute)
                and func.attr in _RE_CALLS
                and isinstance(func.value, ast.Name)
                and func.value.id == "re"
            )
            if is_re and node.args and isinstance(node.args[0], ast.Constant):
                if isinstance(node.args[0].value, str):
                    found[where] = (node.args[0].value, _flags(node))
            for keyword in node.keywords:
                value = keyword.value
                if keyword.arg == "pattern" and isinstance(value, ast.Constant):
                    if isinstance(value.value, str):
                        found[where] = (value.value, 0)
    return found


def crd_patterns() -> dict[str, tuple[str, int]]:
    found: dict[str, tuple[str, int]] = {}

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "pattern" and isinstance(value, str):
                    found[where] = (value, 0)
                else:
                    walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{where}[{index}]")

    for path in sorted((SOURCE / "crds").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            walk(document, path.name)
    return found


PATTERNS = source_patterns() | crd_patterns()


def test_the_patterns_are_found_where_the_validation_is() -> None:
    # The collection is the test's premise: it must see the API's own validation patterns, which
    # live in notify_queue.limits (both doors read them there).
    from notify_queue import limits

    texts = {pattern for pattern, _ in PATTERNS.values()}
    for name in ("EMAIL_PATTERN", "SMS_PATTERN", "POLICY_PATTERN", "CATEGORY_PATTERN"):
        assert getattr(limits, name).pattern in texts, name
    assert any(where.endswith(".yaml") or ".spec" in where for where in PATTERNS)
    assert len(PATTERNS) >= 20


@pytest.mark.parametrize("where", sorted(PATTERNS))
def test_no_pattern_can_match_one_input_in_unboundedly_many_ways(where: str) -> None:
    pattern, flags = PATTERNS[where]
    assert ambiguity(automaton(pattern, flags)) is None, f"{where}: {pattern!r}"


@pytest.mark.parametrize(
    ("pattern", "kind"),
    [
        (OLD_WEBHOOK_URL_PATTERN, "polynomial"),
        (r"^a*a*$", "polynomial"),
        (r"^[^@]+@[^@]+\.[^@]+$", "polynomial"),  # the dot is in both loops' class
        (r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", "polynomial"),  # provider durations, once
        (r"^(a+)+$", "exponential"),
        (r"^(a*)*b$", "exponential"),
        (r"^(\w+\s?)*$", "exponential"),
    ],
)
def test_the_static_check_finds_known_backtracking_patterns(pattern: str, kind: str) -> None:
    assert ambiguity(automaton(pattern)) == kind


def _loop_characters(pattern: str, flags: int) -> list[str]:
    """A few characters each position of the pattern takes (ASCII first), and a few it may
    reject: the alphabet adversarial inputs are made of."""
    a = automaton(pattern, flags)
    chars: set[str] = set(" \t@./:-_aZ09")
    for intervals in a.classes.values():
        for lo, hi in intervals[:3]:
            chars.update(chr(p) for p in {lo, hi, min(lo + 1, hi)} if p < 0xD800 or p > 0xDFFF)
    return sorted(chars)


def _step_bound(pattern: str, flags: int, length: int) -> int:
    """Steps a matcher with a bounded number of ways may take: a constant per character
    (every pair of positions, each way), never a power of the length."""
    a = automaton(pattern, flags)
    ways = max((sum(out.values()) for out in a.edges.values()), default=1)
    return (len(a.classes) + 1) ** 2 * ways * (length + 1)


@st.composite
def adversarial(draw: st.DrawFn, pattern: str, flags: int) -> str:
    """A long run of one short chunk the pattern's loops accept, a prefix that gets there, and
    a last character that may make the whole match fail (where backtracking does its worst)."""
    alphabet = _loop_characters(pattern, flags)
    chars = st.sampled_from(alphabet)
    prefix = "".join(draw(st.lists(chars, max_size=8)))
    chunk = "".join(draw(st.lists(chars, min_size=1, max_size=3)))
    length = draw(st.integers(min_value=200, max_value=2_100))
    return prefix + chunk * (length // len(chunk)) + draw(chars)


@pytest.mark.parametrize("where", sorted(PATTERNS))
def test_rejecting_a_long_adversarial_input_takes_steps_linear_in_its_length(where: str) -> None:
    pattern, flags = PATTERNS[where]
    a = automaton(pattern, flags)

    @settings(max_examples=examples(15), deadline=None, database=None)
    @given(text=adversarial(pattern, flags))
    def check(text: str) -> None:
        assert backtracking_steps(a, text) <= _step_bound(pattern, flags, len(text))

    check()


def test_the_step_count_finds_the_old_webhook_url_pattern_quadratic() -> None:
    # A long URL with a space at its end: n ways to split the host from the rest, each tried.
    a = automaton(OLD_WEBHOOK_URL_PATTERN)
    text = "http://" + "a" * 1_500 + " "
    assert backtracking_steps(a, text) > _step_bound(OLD_WEBHOOK_URL_PATTERN, 0, len(text))
    assert contains(a.classes[len(a.classes)], ord("a"))


def test_webhook_urls_are_parsed_not_matched() -> None:
    from notify_queue.services import validation

    assert not hasattr(validation, "URL_PATTERN")
    assert validation.is_http_url("https://example.com/hook?x=1")
    assert validation.is_http_url("HTTP://[::1]:8080/")
    for bad in ("ftp://x", "http://", "http:///path", "http://a b", "http://" + "a" * 2_000 + " "):
        assert not validation.is_http_url(bad), bad
