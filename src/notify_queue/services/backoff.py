"""Exponential backoff with jitter, for deliveries and webhooks.

After failed attempt n the wait is drawn from [base * 2^(n-1), base * 2^n] ("equal jitter": half
fixed, half random), capped at `maximum`: with base 0.5 s that is 0.5-1 s, 1-2 s, 2-4 s ... as the
spec's table says. The fixed half keeps a struggling provider from being retried too soon; the
random half spreads the retries of a thousand notifications that failed in the same outage.
"""

from __future__ import annotations

import random

_MAX_EXPONENT = 62  # 2**62 * base overflows nothing and is far past any cap


def backoff_seconds(
    attempt: int, *, base: float, maximum: float, rng: random.Random | None = None
) -> float:
    """Seconds to wait after failed attempt `attempt` (1-based)."""
    if attempt < 1:
        raise ValueError("attempt is 1-based")
    ceiling = base * 2.0 ** min(attempt, _MAX_EXPONENT)
    floor = ceiling / 2.0
    draw = (rng or random).uniform(floor, ceiling)
    return min(draw, maximum)


def retry_after_seconds(hint: float, *, maximum: float) -> float:
    """A provider's own Retry-After hint wins over our guess, but never past the cap."""
    return min(max(hint, 0.0), maximum)
