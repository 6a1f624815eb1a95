"""Retention of the delivery log on Citus (docs/scaling.md "Citus: SQL functions"): the
migrations' functions it calls (nq_delivery_log_prepare, nq_delivery_log_expired,
nq_delivery_log_forget_keys_unlocked, nq_delivery_log_drop) run on the coordinator of a
distributed log, a partition past the retention is dropped with its keys, and its rows' counts
leave the status counters.

Real parts: the cluster of tests/citus/cluster.py, `notify-queue migrate`, the repositories as
the worker's housekeeping runs them. The finished notifications are put 40 days back by SQL
(finished_at, then nq_finish_held, as tests/test_retention_keys.py does on plain PostgreSQL)."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import psycopg.sql
import pytest

from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery_log import DeliveryLogRepository
from notify_queue.services.retention import DeliveryLogKeeper
from tests.citus.test_layout import migrate
from tests.support import new, notification_service

pytestmark = pytest.mark.citus

N = 6
SENT_COUNT = "SELECT coalesce(sum(n), 0) FROM nq_counters WHERE name = 'notifications:SENT'"


async def test_a_partition_past_the_retention_is_dropped_with_its_keys_on_citus(
    citus_database: str,
) -> None:
    url = citus_database
    migrate(url)
    async with Database(url, pool_size=2) as db:
        keeper = DeliveryLogKeeper(DeliveryLogRepository(db), retention_days=30)
        await keeper.maintain()  # the fresh database's own partitions are all recent
        service = notification_service(db, announce=False)
        created = await service.enqueue_many(
            [new(recipient=f"old-{i}@example.com", key=f"old-{i}") for i in range(N)]
        )
        ids = [c.notification.id for c in created]

        with psycopg.connect(url, autocommit=True) as conn:
            day, partition = conn.execute(
                "SELECT (now() AT TIME ZONE 'UTC')::date - 40,"
                " 'nq_delivery_log_' || to_char((now() AT TIME ZONE 'UTC')::date - 40, 'YYYYMMDD')"
            ).fetchone() or (None, "")
            conn.execute(
                psycopg.sql.SQL(
                    "CREATE TABLE {p} (LIKE nq_delivery_log INCLUDING DEFAULTS"
                    " INCLUDING CONSTRAINTS)"
                ).format(p=psycopg.sql.Identifier(partition))
            )
            conn.execute(
                psycopg.sql.SQL(
                    "ALTER TABLE nq_delivery_log ATTACH PARTITION {p}"
                    " FOR VALUES FROM ({a}) TO ({b})"
                ).format(
                    p=psycopg.sql.Identifier(partition),
                    a=psycopg.sql.Literal(f"{day} 00:00Z"),
                    b=psycopg.sql.Literal(f"{day + timedelta(days=1)} 00:00Z"),
                )
            )
            conn.execute("UPDATE nq_jobs SET finished_at = %s::timestamptz", [f"{day} 12:00Z"])
            conn.execute(
                "SELECT count(*) FROM nq_finish_held(%s::uuid[], NULL, %s::text[],"
                " NULL, NULL, NULL, NULL, NULL, NULL)",
                [ids, ["SENT"] * N],
            )
            in_partition = conn.execute(
                psycopg.sql.SQL("SELECT count(*) FROM {p}").format(
                    p=psycopg.sql.Identifier(partition)
                )
            ).fetchone()
            distributed = conn.execute(
                "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = %s::regclass",
                [partition],
            ).fetchone()
            assert (in_partition, distributed) == ((N,), (1,))
            sent_before = conn.execute(SENT_COUNT).fetchone()

        dropped = await keeper.maintain()
        assert [(d.partition, d.rows) for d in dropped] == [(partition, N)]
        assert await keeper.maintain() == []  # a second run finds nothing

        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT to_regclass(%s)", [partition]).fetchone() == (None,)
            keys = conn.execute(
                "SELECT count(*) FROM nq_idempotency_keys WHERE key LIKE 'old-%'"
            ).fetchone()
            assert keys == (0,)
            assert conn.execute("SELECT count(*) FROM nq_all_notifications").fetchone() == (0,)
            sent_after = conn.execute(SENT_COUNT).fetchone()
        assert sent_before is not None and sent_after is not None
        assert sent_before[0] - sent_after[0] == N

        # The keys are free again: the same key makes a new notification.
        again = await service.enqueue(new(recipient="old-0@example.com", key="old-0"))
        assert again.created and again.notification.id not in ids
