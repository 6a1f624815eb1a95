"""The two insert paths write the same rows.

The API's common batch (every row PENDING, none a digest's item) goes through nq_enqueue_pending
(0024), everything else, and `notify_queue_enqueue`, through nq_insert_notifications (0016). Both
take the same JSON items; this test inserts the same notifications through each and compares every
stored column but those that name the row (id, key) or its moment, so the two cannot drift apart
unseen (docs/enqueue.md, "One insert path").
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from notify_queue import jsontext
from notify_queue.models import NewNotification, Policy, TemplateRef
from notify_queue.repositories.db import Database
from notify_queue.repositories.notifications import enqueue_item
from notify_queue.repositories.policies import PolicyRepository
from tests.support import new

# Columns that differ between the two copies by construction.
_NAMING = {"id", "idempotency_key", "created_at", "updated_at"}


def _variety() -> list[NewNotification]:
    later = datetime.now(UTC) + timedelta(days=3)
    return [
        new(),
        new(
            send_at=later, expires_at=later + timedelta(hours=1), webhook_url="https://h.example/x"
        ),
        dataclasses.replace(
            new(policy="ns/two"),
            metadata={"b": [1, 2.5, None], "a": {"z": True}},
            category="marketing",
            recipient_id="user-7",
            template=TemplateRef("receipt", 3),
            traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            subject="Hello",
        ),
    ]


def _items(notifications: list[NewNotification]) -> str:
    # The full function also takes a status (and a reason for a row born final).
    return jsontext.dumps_text(
        [enqueue_item(i, n) | {"status": "PENDING"} for i, n in enumerate(notifications)]
    )


async def _rows(conn: psycopg.AsyncConnection[Any], ids: list[uuid.UUID]) -> list[dict[str, Any]]:
    cursor = conn.cursor(row_factory=dict_row)
    await cursor.execute(
        "SELECT * FROM nq_jobs WHERE id = ANY(%(ids)s) ORDER BY array_position(%(ids)s, id)",
        {"ids": ids},
    )
    return [{k: v for k, v in r.items() if k not in _NAMING} for r in await cursor.fetchall()]


async def test_both_insert_paths_store_the_same_rows(db: Database, database_url: str) -> None:
    await PolicyRepository(db).policy_upsert(policy=Policy(name="ns/two", max_attempts=2))
    first = _variety()
    second = [
        dataclasses.replace(n, id=uuid.uuid4(), idempotency_key=uuid.uuid4().hex) for n in first
    ]
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        full = await conn.execute(
            "SELECT id FROM nq_insert_notifications(%s::json, 6, NULL)", (_items(first),)
        )
        pending = await conn.execute(
            "SELECT id FROM nq_enqueue_pending(%s::json, 6, false)", (_items(second),)
        )
        assert len(await full.fetchall()) == len(await pending.fetchall()) == 3

        stored = await _rows(conn, [n.id for n in first])
        assert stored == await _rows(conn, [n.id for n in second])
    assert [r["max_attempts"] for r in stored] == [6, 6, 2]
    assert stored[1]["waiting_reason"] == "Scheduled"
