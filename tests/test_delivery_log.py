"""The queue and the delivery log (migration 0008): the move, retention by whole partitions, and
the migration from the single table, which keeps every row."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from notify_queue.embedded import EmbeddedPostgres
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery_log import DeliveryLogRepository
from notify_queue.repositories.schema import migrate
from notify_queue.services.retention import DeliveryLogKeeper
from tests.support import delivery_log_history, new, notification_service, set_status_sql

_FINISHED = ("SENT", "FAILED", "DEAD_LETTERED", "CANCELLED", "EXPIRED", "SUPPRESSED")


def _rows(conn: psycopg.Connection[Any], query: str, params: Any = None) -> list[tuple[Any, ...]]:
    return conn.execute(query, params).fetchall()


def _counters(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return {
        name: int(n)
        for name, n in _rows(
            conn,
            "SELECT split_part(name, ':', 2), sum(n) FROM nq_counters"
            " WHERE starts_with(name, 'notifications:') GROUP BY name HAVING sum(n) <> 0",
        )
    }


def _add_finished(conn: psycopg.Connection[Any], prefix: str, days_ago: int, n: int) -> None:
    """`n` SENT notifications with their keys, finished `days_ago` days ago, into the log."""
    delivery_log_history(conn)
    conn.execute(
        """WITH rows AS (
               INSERT INTO nq_delivery_log (id, idempotency_key, request_hash, channel, recipient,
                   body, priority, status, send_at, next_attempt_at, max_attempts, finished_at)
               SELECT gen_random_uuid(), %(prefix)s || i, 'h', 'email', 'a@example.com', 'b', 1,
                      'SENT', now(), now(), 6, now() - make_interval(days => %(days)s)
               FROM generate_series(1, %(n)s) i
               RETURNING id, idempotency_key, status),
           keyed AS (INSERT INTO nq_idempotency_keys (key, notification_id, request_hash)
                     SELECT idempotency_key, id, 'h' FROM rows)
           SELECT nq_count('notifications', NULL, array_agg(status), '{}') FROM rows""",
        {"prefix": prefix, "days": days_ago, "n": n},
    )


async def test_a_finished_notification_leaves_the_queue_for_the_log_in_the_same_statement(
    db: Database, database_url: str
) -> None:
    created = await notification_service(db).enqueue(new(key="k"))
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            set_status_sql("id = %(id)s"), {"status": "SENT", "id": created.notification.id}
        )
        assert _rows(conn, "SELECT count(*) FROM nq_jobs") == [(0,)]
        assert _rows(conn, "SELECT status FROM nq_delivery_log") == [("SENT",)]
        # The queue holds unfinished rows only (0013): a hand-written final status is refused.
        other = (await notification_service(db).enqueue(new(key="k2"))).notification.id
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("UPDATE nq_jobs SET status = 'SENT' WHERE id = %s", [other])
    # The key stays taken while its notification is in the log: the same request is a repeat.
    again = await notification_service(db).enqueue(new(key="k"))
    assert not again.created and again.notification.id == created.notification.id


async def test_a_new_database_has_partitions_from_today_on_and_nothing_to_drop(
    db: Database, database_url: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        first, last, n = _rows(
            conn,
            "SELECT min(c.relname::text), max(c.relname::text), count(*) FROM pg_inherits i"
            " JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'nq_delivery_log'::regclass",
        )[0]
        (today,) = _rows(conn, "SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')")[0]
    assert first == f"nq_delivery_log_{today}"
    assert (n, last >= first) == (8, True)  # today and a week ahead
    assert await DeliveryLogKeeper(DeliveryLogRepository(db), retention_days=1).maintain() == []


async def test_retention_drops_whole_partitions_with_their_keys_and_counts(
    db: Database, database_url: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        _add_finished(conn, "old-", days_ago=40, n=300)  # the partition before the daily ones
        _add_finished(conn, "month-", days_ago=31, n=200)  # a daily partition, past 30 days
        _add_finished(conn, "recent-", days_ago=10, n=100)
        partitions_before = _rows(conn, "SELECT count(*) FROM pg_inherits")[0][0]
        assert _counters(conn) == {"SENT": 600}

    keeper = DeliveryLogKeeper(DeliveryLogRepository(db), retention_days=30)
    dropped = await keeper.maintain()
    assert sorted(d.rows for d in dropped if d.rows) == [200, 300]  # and empty days
    assert await keeper.maintain() == []  # nothing left to do the second time

    with psycopg.connect(database_url, autocommit=True) as conn:
        assert _rows(conn, "SELECT count(*) FROM nq_delivery_log") == [(100,)]
        assert _counters(conn) == {"SENT": 100}
        keys = _rows(
            conn, "SELECT split_part(key, '-', 1), count(*) FROM nq_idempotency_keys GROUP BY 1"
        )
        assert keys == [("recent", 100)]
        # Dropped by the table, not emptied by DELETE: the partitions are gone (and a week ahead
        # exists, made by the first run).
        assert _rows(conn, "SELECT count(*) FROM pg_inherits")[0][0] < partitions_before
        assert _rows(
            conn,
            "SELECT to_regclass('nq_delivery_log_' || to_char("
            "now() AT TIME ZONE 'UTC' + interval '7 days', 'YYYYMMDD')) IS NOT NULL",
        ) == [(True,)]
    # A forgotten key may be used again: a new notification.
    reused = await notification_service(db).enqueue(new(key="old-1"))
    assert reused.created


async def test_retention_zero_keeps_everything_and_an_interrupted_drop_is_finished(
    db: Database, database_url: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        _add_finished(conn, "old-", days_ago=40, n=50)
    assert await DeliveryLogKeeper(DeliveryLogRepository(db), retention_days=0).maintain() == []
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert _rows(conn, "SELECT count(*) FROM nq_delivery_log") == [(50,)]
        # A run that stopped after detaching: the table is outside the log, still counted.
        ((name,),) = _rows(conn, "SELECT DISTINCT tableoid::regclass::text FROM nq_delivery_log")
        conn.execute(f'ALTER TABLE nq_delivery_log DETACH PARTITION "{name}"')
        assert _counters(conn) == {"SENT": 50}
    dropped = await DeliveryLogKeeper(DeliveryLogRepository(db), retention_days=30).maintain()
    assert [(d.partition, d.rows) for d in dropped if d.rows] == [(name, 50)]
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert _counters(conn) == {}
        assert _rows(conn, "SELECT count(*) FROM nq_idempotency_keys") == [(0,)]
        assert _rows(conn, "SELECT to_regclass(%s)", [name]) == [(None,)]


async def test_retry_moves_a_row_back_from_the_log_once(db: Database, database_url: str) -> None:
    created = await notification_service(db).enqueue(new(key="k"))
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(set_status_sql("true"), {"status": "FAILED"})
        first = _rows(conn, "SELECT nq_retry(%s)", [[created.notification.id]])
        second = _rows(conn, "SELECT nq_retry(%s)", [[created.notification.id]])
        assert (first, second) == ([(created.notification.id,)], [])
        assert _rows(conn, "SELECT status, attempt_count FROM nq_jobs") == [("PENDING", 0)]
        assert _rows(conn, "SELECT count(*) FROM nq_delivery_log") == [(0,)]
        assert _counters(conn) == {}


def _migrate_to(url: str, version: int | None) -> None:
    """`migrate` up to `version` (every step: None), as `notify-queue migrate` runs it."""

    async def to() -> None:
        async with Database(url, pool_size=1) as database:
            await migrate(database, target=version)

    asyncio.run(to())


def test_every_partition_of_the_log_publishes_its_deletes(pg_server: EmbeddedPostgres) -> None:
    """A database of 0.1.0 with rows in the log, migrated: every partition (the ones with rows,
    the empty ones made ahead, the ones housekeeping makes later) has REPLICA IDENTITY FULL,
    which a Citus shard move by logical replication needs (docs/scaling.md). Before 0009 none
    has."""
    with psycopg.connect(pg_server.url(), autocommit=True) as admin:
        admin.execute("CREATE DATABASE migrate_identity")
    url = pg_server.url("migrate_identity")

    def identities(conn: psycopg.Connection[Any]) -> set[str]:
        rows = _rows(
            conn,
            "SELECT DISTINCT c.relreplident::text FROM pg_inherits i"
            " JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'nq_delivery_log'::regclass",
        )
        return {r[0] for r in rows}

    try:
        _migrate_to(url, 8)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO nq_delivery_log (id, idempotency_key, request_hash, channel,"
                " recipient, body, priority, status, send_at, next_attempt_at, max_attempts,"
                " finished_at) SELECT gen_random_uuid(), 'old' || i, 'h', 'email',"
                " 'a@example.com', 'b', 1, 'SENT', now(), now(), 6, now()"
                " FROM generate_series(1, 5) i"
            )
            # Partitions as 0.1.0 made them (today's prepare, which the baseline step that calls
            # it gets, sets the identity itself).
            for (part,) in _rows(
                conn,
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                " WHERE i.inhparent = 'nq_delivery_log'::regclass",
            ):
                conn.execute(f"ALTER TABLE {part} REPLICA IDENTITY DEFAULT")
            assert identities(conn) == {"d"}
        _migrate_to(url, None)
        with psycopg.connect(url, autocommit=True) as conn:
            assert identities(conn) == {"f"}
            made = _rows(conn, "SELECT nq_delivery_log_prepare(20)")[0][0]
            assert made > 0 and identities(conn) == {"f"}
            assert _rows(conn, "SELECT count(*) FROM nq_delivery_log") == [(5,)]
    finally:
        with psycopg.connect(pg_server.url(), autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS migrate_identity WITH (FORCE)")
