"""Waiting on several events at once, with a deadline."""

from __future__ import annotations

import asyncio


async def wait_any(*events: asyncio.Event, timeout: float) -> None:
    """Return when any of `events` is set or `timeout` seconds have passed."""
    if any(e.is_set() for e in events):
        return
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
