"""The API's batch and a concurrent create of one of its keys, on the real Citus cluster.

The batch inserts its new keys plainly and, when a key was created meanwhile, again as an upsert
in a subtransaction (migration 0034, tests/test_enqueue_keys.py): on Citus the keys are a
distributed table, and the subtransaction's rollback is a savepoint rolled back on the worker
node that refused the key. The answers are those of plain PostgreSQL.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest

from notify_queue.repositories.db import Database
from tests.citus.test_layout import migrate
from tests.test_enqueue_keys import ROWS, batch_while_the_key_is_created

pytestmark = pytest.mark.citus


async def _waiting_on_a_node(url: str) -> bool:
    """The coordinator's backend waits on the worker node, where the shard's insert waits for the
    other transaction's key: Citus shows that wait in citus_lock_waits."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT count(*) > 0 FROM citus_lock_waits")
        return bool((await cur.fetchone())[0])  # type: ignore[index]


async def test_a_key_created_meanwhile_is_answered_as_seen_before(citus_database: str) -> None:
    migrate(citus_database)
    key = "raced-" + uuid.uuid4().hex
    async with Database(citus_database, pool_size=2) as db:
        raced, *rest = await batch_while_the_key_is_created(
            db, citus_database, key, lambda: _waiting_on_a_node(citus_database)
        )
    assert not raced.created and raced.notification.body == "the other request"  # type: ignore[attr-defined]
    assert all(r.created for r in rest)  # type: ignore[attr-defined]
    with psycopg.connect(citus_database) as conn:
        assert conn.execute("SELECT count(*) FROM nq_jobs").fetchone() == (ROWS,)
