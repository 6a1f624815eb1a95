"""The preference rules, in one place: opt-outs and quiet hours (docs/recipients.md).

Pure functions of a recipient's preferences, the notification and a moment, used twice: when a
user-targeted request is expanded (which channels to create) and when a notification is claimed
(`screen_claimed`: send, suppress, defer past quiet hours, or expire). The claim reads the
preferences in its own transaction, so the send-time check is never older than the claim itself.

Time comes from a `Clock` (the documented test seam): the system clock in production, a fixed
moment in tests, so quiet hours across midnight and DST changes are checked without sleeping.
Quiet hours are wall-clock times in the recipient's IANA zone, resolved with `zoneinfo`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from notify_queue.models import (
    CRITICAL_CATEGORY,
    Channel,
    ClaimedNotification,
    Completion,
    Preferences,
    Priority,
    Status,
)

Clock = Callable[[], datetime]
"""Returns the current moment, timezone-aware. The seam tests use to freeze time."""


def system_clock() -> datetime:
    return datetime.now(UTC)


def zone(name: str) -> ZoneInfo:
    """The zone, or UTC for a name this system's tz database does not know (never crash)."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def opt_out_reason(prefs: Preferences, channel: Channel, category: str) -> str | None:
    """Why `channel` is opted out for `category` (None: it is not)."""
    if not prefs.exists:
        return "the recipient was deleted"
    if prefs.opt_out_all:
        return "the recipient opted out of everything"
    if channel.value in prefs.opt_out_channels:
        return f"the recipient opted out of channel {channel.value}"
    if category in prefs.opt_out_categories:
        return f"the recipient opted out of category {category}"
    return None


def passes_quiet_hours(priority: Priority, category: str) -> bool:
    return priority is Priority.HIGH or category == CRITICAL_CATEGORY


def quiet_hours_end(now: datetime, prefs: Preferences) -> datetime | None:
    """When the quiet window `now` falls in ends (UTC); None when `now` is outside any window.

    The window is [start, end) in local wall-clock time; start > end crosses midnight. `now` is
    inside when its local time reads inside the window, whichever occurrence of a repeated
    (autumn) hour it is: a window that covers the repeated hour covers both occurrences.

    The end is the first instant after `now` at which the local time reads outside the window,
    so it is always later than `now`, and the notification deferred to it is outside the window
    when it is claimed again (deferred once, never in a loop). That instant is either the next
    time the clock reads `end` (in the repeated hour, the occurrence after `now`, not the first
    one: the first may be past), or a change of UTC offset on the way there that takes the local
    time out of the window: the spring jump over an `end` that does not exist that day, or the
    autumn jump back to a time before `start`.
    """
    start, end = prefs.quiet_start, prefs.quiet_end
    if start is None or end is None or start == end:
        return None
    tz = zone(prefs.timezone)
    if not _in_window(_wall(now, tz), start, end):
        return None
    reads_end = _next_reading(now, end, tz)
    for change in _offset_changes(tz, now, reads_end):
        if not _in_window(_wall(change, tz), start, end):
            return change
    return reads_end


def held_by_quiet_hours(
    priority: Priority, category: str, timezone: str, start: time, end: time, now: datetime
) -> bool:
    """Whether quiet hours hold a notification at `now` (deferred, or expired inside them):
    what the claim asks before admission, so such a row never takes a place in its recipient's
    rate window (`screen_claimed` then defers it, in the same transaction). The test by which
    `quiet_hours_end` returns a moment, without working out the moment."""
    if passes_quiet_hours(priority, category) or start == end:
        return False
    return _in_window(_wall(now, zone(timezone)), start, end)


def _wall(moment: datetime, tz: ZoneInfo) -> time:
    return moment.astimezone(tz).time().replace(tzinfo=None, fold=0)


def _in_window(clock: time, start: time, end: time) -> bool:
    return start <= clock < end if start < end else (clock >= start or clock < end)


def _next_reading(now: datetime, at: time, tz: ZoneInfo) -> datetime:
    """The first instant after `now` at which the local clock reads `at`. A time that does not
    exist on a day (inside a spring gap) is skipped there; an ambiguous one (autumn) is tried in
    both occurrences, first then second, so the one after `now` is taken."""
    today = now.astimezone(tz).date()
    for days in range(-1, 3):
        day = today + timedelta(days=days)
        for fold in (0, 1):
            local = datetime.combine(day, at).replace(tzinfo=tz, fold=fold)
            instant = local.astimezone(UTC)
            if instant.astimezone(tz).replace(tzinfo=None) != local.replace(tzinfo=None):
                continue  # in the gap: the clock never reads it that day
            if instant > now:
                return instant
    # Unreachable: the clock reads every time of day at least once in any three days.
    raise AssertionError(f"no {at} in {tz.key} after {now}")


# The offset is sampled this often between `now` and the window's end, and bisected where it
# changed. A zone never changes its offset twice within an hour (tzdb's changes are months, at
# the least days, apart), so no change is missed.
_OFFSET_STEP_SECONDS = 3600


def _offset_changes(tz: ZoneInfo, after: datetime, until: datetime) -> list[datetime]:
    """The instants in (after, until] at which the zone's UTC offset changes, in order."""
    changes: list[datetime] = []
    lo = math.floor(after.timestamp())
    lo_offset = _offset(tz, lo)
    end = math.ceil(until.timestamp())
    while lo < end:
        hi = min(lo + _OFFSET_STEP_SECONDS, end)
        hi_offset = _offset(tz, hi)
        if hi_offset != lo_offset:
            a, b = lo, hi  # offset(a) == lo_offset != offset(b): the change is in (a, b]
            while b - a > 1:
                mid = (a + b) // 2
                if _offset(tz, mid) == lo_offset:
                    a = mid
                else:
                    b = mid
            moment = datetime.fromtimestamp(b, UTC)
            if after < moment <= until:
                changes.append(moment)
        lo, lo_offset = hi, hi_offset
    return changes


def _offset(tz: ZoneInfo, seconds: int) -> timedelta | None:
    return datetime.fromtimestamp(seconds, UTC).astimezone(tz).utcoffset()


def screen_claimed(
    claimed: ClaimedNotification, now: datetime, *, without_slot: bool = False
) -> Completion | None:
    """The send-time check of a claimed notification: None to send it, else the completion that
    records why not (SUPPRESSED, deferred past quiet hours, or EXPIRED), giving the claim's
    attempt back, since nothing was tried.

    `without_slot`: the claim admitted it without a rate-limit slot because quiet hours held it
    (`held_by_quiet_hours`). Should they no longer hold it here (its preferences changed between
    the claim's two statements), it is not sent without its slot: it goes back to the queue at
    once and the next claim counts it like any other. An address on the suppression list (as the
    claim read it) ends SUPPRESSED when nothing above decided otherwise."""
    decision = _send_time_check(claimed, now)
    if decision is None and not without_slot and claimed.suppressed is not None:
        # On the suppression list as the claim read it (docs/receipts.md).
        return suppressed(claimed, f"suppressed: {claimed.suppressed}")
    if decision is None and without_slot:
        return Completion(
            claimed.id,
            claimed.claim_token,
            Status.PENDING,
            0.0,
            None,
            None,
            give_back_attempt=True,
            bound_provider=claimed.sticky_provider,
        )
    return decision


def _send_time_check(claimed: ClaimedNotification, now: datetime) -> Completion | None:
    prefs = claimed.preferences
    if claimed.recipient_id is None or prefs is None:
        return None
    reason = opt_out_reason(prefs, claimed.channel, claimed.category)
    if reason is not None:
        return _not_sent(claimed, Status.SUPPRESSED, f"suppressed at send time: {reason}")
    if passes_quiet_hours(claimed.priority, claimed.category):
        return None
    ends = quiet_hours_end(now, prefs)
    if ends is None:
        return None
    if claimed.expires_at is not None and claimed.expires_at <= ends:
        return _not_sent(
            claimed,
            Status.EXPIRED,
            f"expired: expiresAt falls inside the recipient's quiet hours (until {_z(ends)})",
        )
    return Completion(
        claimed.id,
        claimed.claim_token,
        Status.PENDING,
        None,
        f"deferred: the recipient's quiet hours last until {_z(ends)}",
        None,
        next_attempt_at=ends,
        give_back_attempt=True,
        bound_provider=claimed.sticky_provider,
    )


def suppressed(claimed: ClaimedNotification, reason: str) -> Completion:
    """The completion that ends a claimed notification SUPPRESSED for `reason`, unsent."""
    return _not_sent(claimed, Status.SUPPRESSED, reason)


def _not_sent(claimed: ClaimedNotification, status: Status, reason: str) -> Completion:
    return Completion(
        claimed.id,
        claimed.claim_token,
        status,
        None,
        reason,
        None,
        give_back_attempt=True,
        # Nothing was tried: the row keeps the binding an earlier attempt left (its `provider`).
        bound_provider=claimed.sticky_provider,
    )


def _z(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def derived_key(request_key: str, channel: Channel | None) -> str:
    """The idempotency key of one notification of a user-targeted request. A space cannot occur
    in a client's key, so a derived key never collides with one a client chose."""
    return f"{request_key} {channel.value if channel else 'suppressed'}"
