"""Waiting for whichever comes first: a stop, a wake-up, or the end of a pause."""

from __future__ import annotations

import asyncio


async def pause(stop: asyncio.Event, seconds: float, wake: asyncio.Event | None = None) -> None:
    """Sleep up to `seconds`, ending early when `stop` (or `wake`) is set."""
    waiters = [asyncio.ensure_future(stop.wait())]
    if wake is not None:
        waiters.append(asyncio.ensure_future(wake.wait()))
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
