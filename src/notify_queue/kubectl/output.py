"""Text the way kubectl prints it: aligned columns with upper-case headers, short ages, `<none>`."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

NONE = "<none>"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Columns separated by three spaces, as `kubectl get` aligns them."""
    cells = [[str(h) for h in headers]] + [
        [NONE if v is None or v == "" else str(v) for v in row] for row in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def fields(pairs: Iterable[tuple[str, Any]]) -> str:
    """`Label:  value` lines aligned as `kubectl describe` does."""
    pairs = [
        (label, NONE if value is None or value == "" else str(value)) for label, value in pairs
    ]
    width = max((len(label) for label, _ in pairs), default=0) + 2
    return "\n".join(f"{(label + ':').ljust(width)}{value}" for label, value in pairs)


def duration(seconds: float) -> str:
    """kubectl's short duration: 45s, 3m20s, 5h12m, 3d4h, 400d."""
    s = max(0, math.floor(seconds))
    if s < 120:
        return f"{s}s"
    minutes, s = divmod(s, 60)
    if minutes < 10:
        return f"{minutes}m{s}s" if s else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 8:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days, hours = divmod(hours, 24)
    if days < 8:
        return f"{days}d{hours}h" if hours else f"{days}d"
    return f"{days}d"


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def age(text: str | None, now: datetime | None = None) -> str | None:
    moment = parse_time(text)
    if moment is None:
        return None
    return duration(((now or datetime.now(UTC)) - moment).total_seconds())


def relative(text: str | None, now: datetime | None = None) -> str | None:
    """A time with how far it is from now: `2026-09-24T12:01:03Z (in 42s)`, `(3m ago)`."""
    moment = parse_time(text)
    if moment is None:
        return text
    delta = (moment - (now or datetime.now(UTC))).total_seconds()
    stamp = moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{stamp} (in {duration(delta)})" if delta >= 0 else f"{stamp} ({duration(-delta)} ago)"


def as_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=False, default=str)
