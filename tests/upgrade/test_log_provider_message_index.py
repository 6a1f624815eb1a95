"""The log's index by provider message id on an installation that has history (migration 0075,
docs/upgrading.md).

Built as nq_delivery_log_unsent is: 0075 makes it on the log alone and builds its part only on
partitions without rows, so `migrate` reads none of the log's history while holding its writers
back; the partitions with rows get theirs from the workers' housekeeping, CONCURRENTLY, and a
partition made later gets its part when it is attached.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery_log import DeliveryLogRepository
from notify_queue.repositories.schema import migrate
from tests.support import expand_steps_after

ROWS = 6
INDEX = "nq_delivery_log_provider_message"


def _one(url: str, query: str, *params: Any) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query, params or None).fetchone()
        assert row is not None
        return row[0]


def _parts(url: str) -> dict[str, str]:
    """Each partition of the log that has its part of the index: partition -> part."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT ix.indrelid::regclass::text, i.inhrelid::regclass::text"
            " FROM pg_inherits i JOIN pg_index ix ON ix.indexrelid = i.inhrelid"
            " WHERE i.inhparent = %s::regclass",
            (INDEX,),
        ).fetchall()
    return dict(rows)


async def test_partitions_with_rows_get_their_part_from_the_workers(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    async with Database(url, pool_size=2) as db:
        await migrate(db, target=74)
        # History as the schema-74 release left it: SENT rows in today's partition.
        with psycopg.connect(url, autocommit=True) as conn:
            for i in range(ROWS):
                conn.execute(
                    "INSERT INTO nq_delivery_log (id, idempotency_key, request_hash, channel,"
                    " recipient, body, priority, status, send_at, next_attempt_at,"
                    " max_attempts, finished_at, bucket, provider, provider_message_id)"
                    " VALUES (%s, %s, '', 'email', 'r@example.com', 'b', 1, 'SENT', now(),"
                    " now(), 1, now(), 0, 'smtp', %s)",
                    (uuid.uuid4(), f"k{i}", f"m-{i}"),
                )
        today = _one(url, "SELECT tableoid::regclass::text FROM nq_delivery_log LIMIT 1")
        partitions = _one(
            url,
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'nq_delivery_log'::regclass",
        )

        assert await migrate(db) == expand_steps_after(74)
        # The partition with rows was not read: no part there, the index not valid yet; every
        # partition without rows has its part.
        parts = _parts(url)
        assert today not in parts and len(parts) == partitions - 1
        assert (
            _one(url, "SELECT indisvalid FROM pg_index WHERE indexrelid = %s::regclass", INDEX)
            is False
        )

        assert await DeliveryLogRepository(db).partitions_index() == [today]
        assert await DeliveryLogRepository(db).partitions_index() == []
        assert _parts(url)[today] == f"{today}_provider_message"
        assert (
            _one(url, "SELECT indisvalid FROM pg_index WHERE indexrelid = %s::regclass", INDEX)
            is True
        )
        assert _one(
            url, "SELECT pg_get_indexdef(%s::regclass)", f"{today}_provider_message"
        ).endswith("(provider_message_id, provider) WHERE (provider_message_id IS NOT NULL)")

        # A partition made later gets its part when it is attached.
        assert await DeliveryLogRepository(db).partitions_prepare(days_ahead=30) > 0
        assert len(_parts(url)) == _one(
            url,
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'nq_delivery_log'::regclass",
        )
