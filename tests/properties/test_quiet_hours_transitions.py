"""Quiet hours across every change of UTC offset in 2026-2030, in every zone (issue 19).

The transitions are computed, not listed: each zone of `zoneinfo.available_timezones()` has its
offset sampled weekly from 2026 to 2030 and bisected to the second where it changed (no zone
changes twice within five weeks in these years; the test checks that, so a weekly sample misses
none). Zones that change at the same instant between the same offsets read the same local times
around it, so each distinct (instant, offset before, offset after) is checked once.

Around each transition, `now` is placed before, inside and after the spring gap or the autumn
repeated hour, and windows have their start and end in it, just before it and just after it.
What must hold (docs/recipients.md):

- `now` is in quiet hours exactly when its local time reads inside the window (an independent
  reading of the local clock, here), whichever occurrence of a repeated hour it is;
- the resolved end is strictly after `now` (a deferral to the past is claimed again at once:
  the autumn busy loop of issue 19, with `fold=0` an end in the repeated hour was its first
  occurrence even when `now` was in the second);
- at the end the local time reads outside the window, so the notification claimed again then is
  not deferred again (deferred once), and everything before it reads inside (one second before
  the end, the middle, and each offset change on the way): the end is not later than it must be.

Negative control (by hand): with the old resolution (`fold=0`, the end's first occurrence) the
sweep and the drawn examples fail "after now", first at Africa/Casablanca on 2026-02-15 (back from
+01 to +00 at 03:00: now in the second 02:00, a window 01:20-02:30 resolved to the first 02:30,
half an hour before now).
"""

from __future__ import annotations

import functools
import itertools
import zoneinfo
from datetime import UTC, datetime, time, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from notify_queue.models import Preferences
from notify_queue.services.preferences import quiet_hours_end
from tests.properties.conftest import examples

_FROM = datetime(2026, 1, 1, tzinfo=UTC)
_TO = datetime(2031, 1, 1, tzinfo=UTC)
_SAMPLE = timedelta(days=7)


@functools.cache
def changes_of(zone: str) -> list[tuple[datetime, timedelta, timedelta]]:
    """(instant, offset before, offset after) of the zone's changes in 2026-2030, in order."""
    tz = zoneinfo.ZoneInfo(zone)
    found: list[tuple[datetime, timedelta, timedelta]] = []
    lo = int(_FROM.timestamp())
    lo_offset = _offset(tz, lo)
    while lo < int(_TO.timestamp()):
        hi = lo + int(_SAMPLE.total_seconds())
        hi_offset = _offset(tz, hi)
        if hi_offset != lo_offset:
            a, b = lo, hi
            while b - a > 1:
                mid = (a + b) // 2
                a, b = (mid, b) if _offset(tz, mid) == lo_offset else (a, mid)
            found.append((datetime.fromtimestamp(b, UTC), lo_offset, hi_offset))
        lo, lo_offset = hi, hi_offset
    # The weekly sample is enough only if the zone never changes twice within a sample.
    for (earlier, _, _), (later, _, _) in itertools.pairwise(found):
        assert later - earlier > 2 * _SAMPLE, (zone, earlier, later)
    return found


@functools.cache
def transitions() -> list[tuple[str, datetime, timedelta, timedelta]]:
    """(a zone, the instant, offset before, offset after) of every distinct change, in order."""
    seen: dict[tuple[datetime, timedelta, timedelta], str] = {}
    for zone in sorted(zoneinfo.available_timezones()):
        for change in changes_of(zone):
            seen.setdefault(change, zone)
    found = [(z, at, before, after) for (at, before, after), z in seen.items()]
    return sorted(found, key=lambda t: (t[1], t[0]))


def _offset(tz: zoneinfo.ZoneInfo, seconds: int) -> timedelta:
    offset = datetime.fromtimestamp(seconds, UTC).astimezone(tz).utcoffset()
    assert offset is not None
    return offset


def local_time(moment: datetime, zone: str) -> time:
    """The local clock's reading: UTC plus the zone's offset at that instant."""
    tz = zoneinfo.ZoneInfo(zone)
    offset = moment.astimezone(tz).utcoffset()
    assert offset is not None
    return (moment.astimezone(UTC) + offset).time().replace(tzinfo=None)


def reads_inside(clock: time, start: time, end: time) -> bool:
    return start <= clock < end if start < end else (clock >= start or clock < end)


def minute(clock: datetime) -> time:
    return clock.time().replace(second=0, microsecond=0)


def check(zone: str, now: datetime, start: time, end: time) -> None:
    prefs = Preferences(exists=True, timezone=zone, quiet_start=start, quiet_end=end)
    ends = quiet_hours_end(now, prefs)
    inside = reads_inside(local_time(now, zone), start, end)
    assert (ends is not None) == inside, (zone, now, start, end, ends)
    if ends is None:
        return
    assert ends > now, (zone, now, start, end, ends)
    # Claimed again at its end, the notification is sent: deferred once.
    assert quiet_hours_end(ends, prefs) is None, (zone, now, start, end, ends)
    assert not reads_inside(local_time(ends, zone), start, end)
    # ... and not later than it must be: before the end, the clock still reads inside.
    probes = [ends - timedelta(seconds=1), now + (ends - now) / 2]
    probes += [at for at, _, _ in changes_of(zone) if now < at < ends]
    for probe in probes:
        if probe > now:
            assert reads_inside(local_time(probe, zone), start, end), (zone, now, start, end, probe)


def around(at: datetime, before: timedelta, after: timedelta) -> tuple[datetime, datetime, time]:
    """The wall times just before the change and just after it, and the middle of the gap or the
    repeated stretch (as a wall time)."""
    wall_before = (at - timedelta(microseconds=1) + before).replace(tzinfo=None)
    wall_after = (at + after).replace(tzinfo=None)
    low, high = min(wall_before, wall_after), max(wall_before, wall_after)
    return low, high, minute(low + (high - low) / 2)


def test_the_transitions_of_2026_to_2030_are_found_in_spring_and_autumn() -> None:
    found = transitions()
    forward = [t for t in found if t[3] > t[2]]
    back = [t for t in found if t[3] < t[2]]
    assert len(forward) > 100 and len(back) > 100
    changes = {(at, before, after) for _, at, before, after in found}
    hour = timedelta(hours=1)
    # Central Europe's (Berlin's) changes of 2027, forward and back, are among them.
    assert (datetime(2027, 3, 28, 1, tzinfo=UTC), hour, 2 * hour) in changes
    assert (datetime(2027, 10, 31, 1, tzinfo=UTC), 2 * hour, hour) in changes


def test_every_transition_resolves_windows_in_and_around_the_gap_or_repeated_hour() -> None:
    for zone, at, before, after in transitions():
        low, high, middle = around(at, before, after)
        shift = abs(after - before)
        edges = [minute(low - timedelta(minutes=40)), middle, minute(high + timedelta(minutes=40))]
        windows = [(s, e) for s in edges for e in edges if s != e]
        nows = [
            at - shift - timedelta(minutes=30),
            at - shift / 2,
            at - timedelta(seconds=1),
            at,
            at + shift / 2,
            at + shift + timedelta(minutes=30),
        ]
        for start, end in windows:
            for now in nows:
                check(zone, now, start, end)


@settings(max_examples=examples(200), deadline=None, database=None)
@given(
    data=st.data(),
    now_minutes=st.integers(min_value=-26 * 60, max_value=26 * 60),
    start_minutes=st.integers(min_value=-180, max_value=180),
    end_minutes=st.integers(min_value=-180, max_value=180),
)
def test_any_moment_near_a_transition_defers_to_a_later_end_outside_the_window(
    data: st.DataObject, now_minutes: int, start_minutes: int, end_minutes: int
) -> None:
    zone, at, before, after = data.draw(st.sampled_from(transitions()))
    low, _, _ = around(at, before, after)
    start = minute(low + timedelta(minutes=start_minutes))
    end = minute(low + timedelta(minutes=end_minutes))
    if start == end:
        return
    second = data.draw(st.integers(min_value=0, max_value=59))
    check(zone, at + timedelta(minutes=now_minutes, seconds=second), start, end)
