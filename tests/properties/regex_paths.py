"""How many ways a regular expression can match: the measure behind tests/properties/
test_linear_patterns.py.

Python's `re` is a backtracking matcher: on an input it finally rejects, it tries every way the
pattern could have matched each prefix. That costs time linear in the input only if the number
of ways stays bounded; a pattern with two overlapping loops one after the other (`[^ ]+[^ ]*`)
has n ways to split n characters (quadratic time), nested loops (`(a+)+`) 2^n. This module turns
a pattern (as `re._parser` reads it) into its position automaton (Glushkov's construction, with
the number of ways to take each edge kept), and offers two deterministic measures:

- `ambiguity`: a static proof, from the automaton alone (Weideman et al., "Analyzing Matching
  Time Behavior of Backtracking Regular Expression Matchers by Using Ambiguity of NFA", 2016):
  "exponential" if a state can loop back to itself in two ways on one string, "polynomial" if
  two different states p and q loop on one string w and p also reaches q on w, else None
  (bounded ways: linear time).
- `backtracking_steps`: the edges a backtracking matcher takes to reject an input, counted by
  running one over the automaton (every way, depth first, as `re` explores them).

Bounded repeats are read as unbounded ones (`{0,251}` as `*`, `{8,15}` as `+`) unless short
(at most 16): that adds ways to match, never removes one, so a pattern found unambiguous here
is unambiguous as written. Anchors match nothing and are left out (the patterns are matched
whole). Look-arounds and back-references are refused: the project uses none.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from re import _constants as c  # type: ignore[attr-defined]
from re import _parser  # type: ignore[attr-defined]
from typing import Any

MAX_CODE_POINT = sys.maxunicode
EXPANDED_REPEAT = 16  # {m,n} with n at most this is expanded; longer ones read as loops

Intervals = tuple[tuple[int, int], ...]  # sorted, disjoint, inclusive code-point ranges


def _from_points(points: list[int]) -> Intervals:
    ranges: list[tuple[int, int]] = []
    for point in sorted(set(points)):
        if ranges and ranges[-1][1] + 1 == point:
            ranges[-1] = (ranges[-1][0], point)
        else:
            ranges.append((point, point))
    return tuple(ranges)


def _union(*sets: Intervals) -> Intervals:
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(r for s in sets for r in s):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return tuple(merged)


def _complement(s: Intervals) -> Intervals:
    out, start = [], 0
    for lo, hi in s:
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CODE_POINT:
        out.append((start, MAX_CODE_POINT))
    return tuple(out)


def intersect(a: Intervals, b: Intervals) -> Intervals:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


def contains(s: Intervals, point: int) -> bool:
    return any(lo <= point <= hi for lo, hi in s)


@cache
def _category(name: str) -> Intervals:
    """`re`'s own classes of str patterns, by the same tests its C code makes."""
    tests: dict[str, Callable[[str], bool]] = {
        "DIGIT": str.isdecimal,
        "SPACE": str.isspace,
        "WORD": lambda ch: ch.isalnum() or ch == "_",
    }
    kind = name.removeprefix("CATEGORY_").removeprefix("UNI_")
    test = tests[kind.removeprefix("NOT_")]
    found = _from_points([p for p in range(MAX_CODE_POINT + 1) if test(chr(p))])
    return _complement(found) if kind.startswith("NOT_") else found


def _case_folded(s: Intervals) -> Intervals:
    """ASCII letters in both cases (the project's IGNORECASE patterns are ASCII)."""
    extra = [
        ord(ch.swapcase())
        for lo, hi in s
        for p in range(max(lo, 65), min(hi, 122) + 1)
        if (ch := chr(p)).isascii() and ch.isalpha()
    ]
    return _union(s, _from_points(extra))


def _items(items: list[tuple[Any, Any]]) -> Intervals:
    negate = False
    parts: list[Intervals] = []
    for op, av in items:
        if op is c.NEGATE:
            negate = True
        elif op is c.LITERAL:
            parts.append(((int(av), int(av)),))
        elif op is c.RANGE:
            lo, hi = av
            parts.append(((lo, hi),))
        elif op is c.CATEGORY:
            parts.append(_category(str(av)))
        else:
            raise ValueError(f"unsupported set item {op}")
    union = _union(*parts)
    return _complement(union) if negate else union


@dataclass
class _Part:
    """Glushkov's sets of a sub-expression, each position with the number of ways to it."""

    nullable: bool
    first: Counter[int] = field(default_factory=Counter)
    last: Counter[int] = field(default_factory=Counter)


@dataclass
class Automaton:
    """Positions 1..n (0 is the start); `edges[p][q]`: the ways from p to q, reading a
    character of `classes[q]`."""

    classes: dict[int, Intervals] = field(default_factory=dict)
    edges: dict[int, Counter[int]] = field(default_factory=dict)
    accepting: set[int] = field(default_factory=set)
    nested_nullable_loop: bool = False

    def _position(self, chars: Intervals) -> _Part:
        position = len(self.classes) + 1
        self.classes[position] = chars
        self.edges[position] = Counter()
        return _Part(False, Counter({position: 1}), Counter({position: 1}))

    def _link(self, lasts: Counter[int], firsts: Counter[int]) -> None:
        for p, ways_p in lasts.items():
            for q, ways_q in firsts.items():
                self.edges[p][q] += ways_p * ways_q

    def _sequence(self, items: list[tuple[Any, Any]], flags: int) -> _Part:
        part = _Part(True)
        for item in items:
            part = self._then(part, self._node(item, flags))
        return part

    def _then(self, a: _Part, b: _Part) -> _Part:
        self._link(a.last, b.first)
        return _Part(
            a.nullable and b.nullable,
            a.first + b.first if a.nullable else a.first,
            b.last + a.last if b.nullable else b.last,
        )

    def _node(self, item: tuple[Any, Any], flags: int) -> _Part:
        op, av = item
        fold = _case_folded if flags & re.IGNORECASE else (lambda s: s)
        if op is c.LITERAL:
            return self._position(fold(((int(av), int(av)),)))
        if op is c.NOT_LITERAL:
            return self._position(_complement(fold(((int(av), int(av)),))))
        if op is c.IN:
            return self._position(fold(_items(av)))
        if op is c.ANY:
            everything = ((0, MAX_CODE_POINT),)
            return self._position(everything if flags & re.DOTALL else _complement(((10, 10),)))
        if op is c.AT:
            return _Part(True)
        if op in (c.SUBPATTERN, c.ATOMIC_GROUP):
            if op is c.SUBPATTERN:
                _group, add_flags, del_flags, body = av
                return self._sequence(body, (flags | add_flags) & ~del_flags)
            return self._sequence(av, flags)
        if op is c.BRANCH:
            _, branches = av
            parts = [self._sequence(b, flags) for b in branches]
            return _Part(
                any(p.nullable for p in parts),
                sum((p.first for p in parts), Counter()),
                sum((p.last for p in parts), Counter()),
            )
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            low, high, body = av
            return self._repeat(int(low), int(high), body, flags)
        raise ValueError(f"unsupported pattern element {op}")

    def _repeat(self, low: int, high: int, body: list[tuple[Any, Any]], flags: int) -> _Part:
        if high <= EXPANDED_REPEAT:
            part = _Part(True)
            for index in range(high):
                copy = self._sequence(body, flags)
                if index >= low:
                    copy = _Part(True, copy.first, copy.last)
                part = self._then(part, copy)
            return part
        loop = self._sequence(body, flags)
        if loop.nullable:
            self.nested_nullable_loop = True  # (a*)*: unboundedly many ways to match nothing
        self._link(loop.last, loop.first)
        return _Part(loop.nullable or low == 0, loop.first, loop.last)


def automaton(pattern: str, flags: int = 0) -> Automaton:
    parsed = _parser.parse(pattern, flags)
    result = Automaton()
    whole = result._sequence(list(parsed), parsed.state.flags)
    result.edges[0] = Counter(whole.first)
    result.accepting = set(whole.last) | ({0} if whole.nullable else set())
    return result


def ambiguity(a: Automaton) -> str | None:
    """'exponential', 'polynomial', or None (the ways to match any input are bounded)."""
    if a.nested_nullable_loop:
        return "exponential"
    states = list(a.edges)
    # Only a state on a cycle can loop: the others are passed once on any input.
    looping = [q for q in states if q in _reachable(a, q)]

    def pairs(p: int, q: int) -> list[tuple[int, int, bool]]:
        """Steps of two runs on one character: (p', q', whether they split from p == q)."""
        out = []
        for p2, ways_p in a.edges[p].items():
            for q2 in a.edges[q]:
                if intersect(a.classes[p2], a.classes[q2]):
                    out.append((p2, q2, p == q and (p2 != q2 or ways_p > 1)))
        return out

    # Exponential: a state loops back to itself on one string along two different paths,
    # i.e. (q, q) reaches (q, q) through a split in the product of the automaton with itself.
    for q in looping:
        split_reach: set[tuple[int, int]] = set()
        plain_reach: set[tuple[int, int]] = {(q, q)}
        stack = [((q, q), False)]
        while stack:
            (x, y), split = stack.pop()
            for x2, y2, splits in pairs(x, y):
                now_split = split or splits
                seen = split_reach if now_split else plain_reach
                if (x2, y2) in seen:
                    continue
                seen.add((x2, y2))
                stack.append(((x2, y2), now_split))
        if (q, q) in split_reach:
            return "exponential"
    # Polynomial: p != q with p ->w p, p ->w q and q ->w q, one search of the triple product.
    for p in looping:
        for q in looping:
            if p == q or q not in _reachable(a, p):
                continue
            start, goal = (p, p, q), (p, q, q)
            seen_triples = {start}
            stack3 = [start]
            while stack3:
                x, y, z = stack3.pop()
                for x2 in a.edges[x]:
                    for y2 in a.edges[y]:
                        xy = intersect(a.classes[x2], a.classes[y2])
                        if not xy:
                            continue
                        for z2 in a.edges[z]:
                            if not intersect(xy, a.classes[z2]):
                                continue
                            if (x2, y2, z2) == goal:
                                return "polynomial"
                            if (x2, y2, z2) not in seen_triples:
                                seen_triples.add((x2, y2, z2))
                                stack3.append((x2, y2, z2))
    return None


def _reachable(a: Automaton, start: int) -> set[int]:
    """The states one or more characters lead to from `start`."""
    seen: set[int] = set()
    stack = list(a.edges[start])
    while stack:
        state = stack.pop()
        if state not in seen:
            seen.add(state)
            stack.extend(a.edges[state])
    return seen


def backtracking_steps(a: Automaton, text: str) -> int:
    """The edges a backtracking matcher takes before it rejects `text` (or accepts it), trying
    every way in turn: the work `re` does on the same input, in steps rather than seconds."""
    steps = 0
    stack = [(0, 0)]  # (state, characters read)
    while stack:
        state, read = stack.pop()
        if read == len(text):
            if state in a.accepting:
                return steps
            continue
        point = ord(text[read])
        for target, ways in a.edges[state].items():
            if contains(a.classes[target], point):
                steps += ways
                stack.extend([(target, read + 1)] * ways)
    return steps
