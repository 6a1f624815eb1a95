"""The attempt log's `at` (`worker.routing.MillisecondClock`): formatted once per millisecond, and
the same text `datetime.now(UTC).isoformat(timespec="milliseconds")` wrote for that instant."""

from __future__ import annotations

import random
import re
import time
from datetime import UTC, datetime, timedelta

import pytest

from notify_queue.worker.routing import MillisecondClock


def _as_before(ns: int) -> str:
    """What the entry's `at` was before the clock: `datetime.now` (microseconds) at `ns`."""
    moment = datetime.fromtimestamp(ns // 10**9, UTC) + timedelta(microseconds=ns % 10**9 // 1000)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@pytest.fixture
def now_ns(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The nanoseconds `time.time_ns()` answers while the test runs (set `now_ns[0]`)."""
    current = [0]
    monkeypatch.setattr(time, "time_ns", lambda: current[0])
    return current


def test_the_text_is_the_one_datetime_wrote_for_the_same_instant(now_ns: list[int]) -> None:
    clock = MillisecondClock()
    rng = random.Random(20261205)
    samples = [rng.randrange(0, 4_102_444_800 * 10**9) for _ in range(2_000)]
    # The edges of a millisecond, a second and a day, where truncation and carries show.
    samples += [1_764_949_976_123_999_999, 1_764_949_976_124_000_000, 1_764_892_799_999_999_999]
    for ns in samples:
        now_ns[0] = ns
        assert clock.now() == _as_before(ns)


def test_one_millisecond_is_formatted_once_and_the_next_one_anew(now_ns: list[int]) -> None:
    clock = MillisecondClock()
    now_ns[0] = 1_764_949_976_123_000_001
    first = clock.now()
    now_ns[0] = 1_764_949_976_123_999_999
    assert clock.now() is first  # the same millisecond: the text made for it
    now_ns[0] = 1_764_949_976_124_000_000
    assert clock.now() == "2025-12-05T15:52:56.124Z" != first


def test_the_real_clock_agrees_with_datetime_now() -> None:
    clock = MillisecondClock()
    before = datetime.now(UTC)
    text = clock.now()
    after = datetime.now(UTC)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", text)
    # Truncated to its millisecond: up to 1 ms before the instant it was read at.
    assert before - timedelta(milliseconds=1) < datetime.fromisoformat(text) <= after
