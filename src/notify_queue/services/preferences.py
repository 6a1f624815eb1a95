"""The preference rules, in one place: opt-outs and quiet hours (CONTRACT §9, docs/recipients.md).

Pure functions of a recipient's preferences, the notification and a moment, used twice: when a
user-targeted request is expanded (which channels to create) and when a notification is claimed
(`screen_claimed`: send, suppress, defer past quiet hours, or expire). The claim reads the
preferences in its own transaction, so the send-time check is never older than the claim itself.

Time comes from a `Clock` (the documented test seam): the system clock in production, a fixed
moment in tests, so quiet hours across midnight and DST changes are checked without sleeping.
Quiet hours are wall-clock times in the recipient's IANA zone, resolved with `zoneinfo`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta
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

    The window is [start, end) in local wall-clock time; start > end crosses midnight. Its end
    is the next local `end` after `now`, turned into an instant by zoneinfo: on a DST change the
    local times are taken as the zone defines them (a nonexistent end time, inside the spring
    gap, is read with the offset before the change, i.e. shifted forward by the gap).
    """
    start, end = prefs.quiet_start, prefs.quiet_end
    if start is None or end is None or start == end:
        return None
    tz = zone(prefs.timezone)
    local = now.astimezone(tz)
    clock = local.time().replace(tzinfo=None)
    inside = start <= clock < end if start < end else (clock >= start or clock < end)
    if not inside:
        return None
    day = local.date()
    if start > end and clock >= start:  # evening part of a window across midnight
        day = day + timedelta(days=1)
    return _instant(day, end, tz)


def held_by_quiet_hours(
    priority: Priority, category: str, timezone: str, start: time, end: time, now: datetime
) -> bool:
    """Whether quiet hours hold a notification at `now` (deferred, or expired inside them):
    what the claim asks before admission, so such a row never takes a place in its recipient's
    rate window (`screen_claimed` then defers it, in the same transaction)."""
    if passes_quiet_hours(priority, category):
        return False
    prefs = Preferences(
        exists=True,
        opt_out_all=False,
        opt_out_channels=frozenset(),
        opt_out_categories=frozenset(),
        timezone=timezone,
        quiet_start=start,
        quiet_end=end,
    )
    return quiet_hours_end(now, prefs) is not None


def _instant(day: date, at: time, tz: ZoneInfo) -> datetime:
    # fold=0: an ambiguous time (autumn) is its first occurrence; a nonexistent one (spring gap)
    # is read with the pre-gap offset, which lands after the gap: both after the quiet window.
    return datetime.combine(day, at).replace(tzinfo=tz, fold=0).astimezone(UTC)


def screen_claimed(
    claimed: ClaimedNotification, now: datetime, *, without_slot: bool = False
) -> Completion | None:
    """The send-time check of a claimed notification: None to send it, else the completion that
    records why not (SUPPRESSED, deferred past quiet hours, or EXPIRED), giving the claim's
    attempt back, since nothing was tried.

    `without_slot`: the claim admitted it without a rate-limit slot because quiet hours held it
    (`held_by_quiet_hours`). Should they no longer hold it here (its preferences changed between
    the claim's two statements), it is not sent without its slot: it goes back to the queue at
    once and the next claim counts it like any other."""
    decision = _send_time_check(claimed, now)
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


def _not_sent(claimed: ClaimedNotification, status: Status, reason: str) -> Completion:
    return Completion(
        claimed.id,
        claimed.claim_token,
        status,
        None,
        reason,
        None,
        give_back_attempt=True,
        # Nothing was tried: the row keeps the binding an earlier attempt left (migration 0009).
        bound_provider=claimed.sticky_provider,
    )


def _z(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def derived_key(request_key: str, channel: Channel | None) -> str:
    """The idempotency key of one notification of a user-targeted request. A space cannot occur
    in a client's key, so a derived key never collides with one a client chose."""
    return f"{request_key} {channel.value if channel else 'suppressed'}"
