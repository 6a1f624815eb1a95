"""A claim's new row versions stay on their page (migration 0025; docs/performance.md, "The
drain's CPU, step by step", step 9).

A claim rewrites every queue row it admits, and a new version on the old one's page is logged as
the changed middle of the row instead of whole. A burst of creates fills each page to the
table's fillfactor; at 45 every row of a page has room for its claimed version there. The rows
here are the smallest a create makes (a five-letter body), whose claimed version grows the most
(a token, a lease and a provider where there were NULLs). Checked by
where the rows are (each row's block before and after the claim, from its ctid), never by a
count of bytes; the negative control is the same burst and claim at fillfactor 70 (0023), where
some rows move.
"""

from __future__ import annotations

import uuid

import psycopg

from notify_queue.models import Channel, Priority
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery import DeliveryRepository
from tests.support import defaults, new, notification_service

BURST = 300


async def _blocks(database_url: str) -> dict[uuid.UUID, int]:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cur = await conn.execute("SELECT id, (ctid::text::point)[0]::bigint FROM nq_jobs")
        return {id: int(block) for id, block in await cur.fetchall()}


async def _moved_by_a_claim(db: Database, database_url: str) -> int:
    """Rows of a burst whose claimed version went to another page."""
    await notification_service(db, announce=False).enqueue_many([new() for _ in range(BURST)])
    before = await _blocks(database_url)
    batch = await DeliveryRepository(db, defaults(rate_limit=1_000)).notifications_claim(
        priorities=list(Priority), channels=list(Channel), limit=BURST
    )
    assert len(batch.claimed) == BURST
    after = await _blocks(database_url)
    assert after.keys() == before.keys()
    return sum(1 for i, block in after.items() if block != before[i])


async def test_a_claimed_row_keeps_its_page(db: Database, database_url: str) -> None:
    assert await _moved_by_a_claim(db, database_url) == 0


async def test_at_the_old_fillfactor_claimed_rows_move(db: Database, database_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("ALTER TABLE nq_jobs SET (fillfactor = 70)")
    assert await _moved_by_a_claim(db, database_url) > 0
