"""The log's status index without SENT rows on an installation that has history (migrations
0009/0015, docs/upgrading.md).

0009 makes the index on the log alone and builds its part only on partitions without rows; the
partitions with rows get theirs from the workers' housekeeping, CONCURRENTLY, and until then
`migrate --contract` refuses to drop the index 0009 replaces, saying why. A build cut short (an
invalid index left under the part's name) is dropped and built again.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from typing import Any

import psycopg
import pytest

from notify_queue.errors import ContractStepWaits
from notify_queue.models import Status
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery_log import DeliveryLogRepository
from notify_queue.repositories.notifications import NotificationRepository
from notify_queue.repositories.schema import migrate
from tests.support import expand_steps_after

ROWS = 12


def _one(url: str, query: str, *params: Any) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query, params or None).fetchone()
        assert row is not None
        return row[0]


async def test_partitions_with_rows_get_their_part_from_the_workers_then_contract_drops_the_old(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    async with Database(url, pool_size=2) as db:
        await migrate(db, target=8)
        # History as 0.1.0 left it: final rows in today's partition, written directly.
        ids = [uuid.uuid4() for _ in range(ROWS)]
        failed = set(ids[::3])
        with psycopg.connect(url, autocommit=True) as conn:
            for i, id in enumerate(ids):
                conn.execute(
                    "INSERT INTO nq_delivery_log (id, idempotency_key, request_hash, channel,"
                    " recipient, body, priority, status, send_at, next_attempt_at,"
                    " max_attempts, finished_at)"
                    " VALUES (%s, %s, '', 'email', 'r@example.com', 'b', 1, %s, now(), now(),"
                    " 1, now())",
                    (id, f"k{i}", "FAILED" if id in failed else "SENT"),
                )
        today = _one(url, "SELECT tableoid::regclass::text FROM nq_delivery_log LIMIT 1")

        assert await migrate(db) == expand_steps_after(8)
        assert (
            _one(
                url,
                "SELECT indisvalid FROM pg_index"
                " WHERE indexrelid = 'nq_delivery_log_unsent'::regclass",
            )
            is False
        )
        missing = [
            r["partition_name"]
            for r in await db.fetch_all(
                "delivery_log_index_missing", {"index": "nq_delivery_log_unsent"}
            )
        ]
        assert missing == [today]

        with pytest.raises(ContractStepWaits, match="on 1 partitions"):
            await migrate(db, contract=True)
        # The command an operator runs: exit 1 and one line saying why, nothing applied.
        refused = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "notify_queue", "migrate", "--contract", "--database-url", url],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert refused.returncode == 1, refused.stderr
        last = refused.stderr.strip().splitlines()[-1]
        assert last.startswith("notify-queue migrate: 0015_release_0_2_0_contract: ")
        assert "not built on 1 partitions yet" in last and "Traceback" not in refused.stderr
        assert _one(url, "SELECT to_regclass('nq_delivery_log_status_created') IS NOT NULL")

        # A build cut short leaves an invalid index under the part's name.
        with psycopg.connect(url, autocommit=True) as conn, pytest.raises(psycopg.Error):
            conn.execute(f"CREATE UNIQUE INDEX CONCURRENTLY {today}_unsent ON {today} (channel)")
        assert (
            _one(
                url,
                "SELECT indisvalid FROM pg_index WHERE indexrelid = %s::regclass",
                f"{today}_unsent",
            )
            is False
        )

        assert await DeliveryLogRepository(db).partitions_index() == [today]
        assert await DeliveryLogRepository(db).partitions_index() == []
        assert (
            _one(
                url,
                "SELECT indisvalid FROM pg_index"
                " WHERE indexrelid = 'nq_delivery_log_unsent'::regclass",
            )
            is True
        )
        assert _one(url, "SELECT pg_get_indexdef(%s::regclass)", f"{today}_unsent").endswith(
            "(status, created_at, id) WHERE (status <> 'SENT'::text)"
        )

        assert await migrate(db, contract=True) == [15, 22]
        assert _one(url, "SELECT to_regclass('nq_delivery_log_status_created') IS NULL")
        listed = await NotificationRepository(db).notifications_list(
            status=Status.FAILED, channel=None, recipient=None, after=None, limit=50
        )
        assert {n.id for n in listed} == failed
