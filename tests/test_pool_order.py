"""The pool hands out the connection given back last: the connections a role needs at once stay
warm (their plans and catalog caches made once), the others idle where the pool closes them."""

from __future__ import annotations

import asyncio
from typing import Any

from psycopg_pool import AsyncConnectionPool

from notify_queue.repositories.db import _MostRecentFirstPool


async def _two_at_once_then_three_in_turn(
    pool: AsyncConnectionPool[Any],
) -> tuple[int, list[int]]:
    """Two connections in use at once (the outer one given back last), then three calls one
    after the other: the outer connection's pid and the pids the three calls ran on."""
    await pool.open(wait=True)
    try:
        async with pool.connection() as outer:
            async with pool.connection() as inner:
                assert inner.info.backend_pid != outer.info.backend_pid
            given_back_last = outer.info.backend_pid
        seen = []
        for _ in range(3):
            async with pool.connection() as conn:
                seen.append(conn.info.backend_pid)
            await asyncio.sleep(0)
        return given_back_last, seen
    finally:
        await pool.close()


async def test_the_connection_given_back_last_is_handed_out_first(database_url: str) -> None:
    pool = _MostRecentFirstPool(database_url, min_size=1, max_size=4, open=False)
    given_back_last, seen = await _two_at_once_then_three_in_turn(pool)
    assert seen == [given_back_last] * 3


async def test_psycopg_pool_alone_hands_them_out_in_turn(database_url: str) -> None:
    """The negative control: psycopg_pool's own order alternates between the two."""
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        database_url, min_size=1, max_size=4, open=False
    )
    _, seen = await _two_at_once_then_three_in_turn(pool)
    assert len(set(seen)) == 2
