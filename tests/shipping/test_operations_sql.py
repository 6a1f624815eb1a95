"""The SQL in docs/operations.md (closing a provider's circuit by hand, re-sending failed webhook
events, autovacuum settings, archiving the delivery log's partitions before retention drops them,
pruning old events) runs against the current schema and does what the page says.

The archive job is also run the way it is deployed, over simulated days (issue 19: it used to
copy only what was past the retention when it ran, which hourly retention had dropped already):
the database's `now()` is a clock the test sets (a `public.now()` searched before pg_catalog, in
this test's own database only), so the workers' real retention code, the partitions it creates
ahead and the job all see the same days go by. Every partition retention drops, those created
after the job was first run included, must be in the archive with every row it held.
Negative control (by hand): the earlier job (`nq_delivery_log_expired(interval '3 days')`, the
retention of this test) archives none of the partitions the simulated days create.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

import psycopg

from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery_log import DeliveryLogRepository
from notify_queue.services.retention import DeliveryLogKeeper
from tests.shipping.support import ROOT
from tests.support import delivery_log_history


def operations_sql() -> list[str]:
    """The page's SQL blocks an operator runs on the database; the roles recipe ("as an
    administrator") makes server-wide roles and is run by tests/test_database_roles.py's way."""
    blocks = re.findall(r"```sql\n(.*?)```", (ROOT / "docs" / "operations.md").read_text(), re.S)
    return [block for block in blocks if not block.startswith("-- as an administrator")]


def test_the_operations_sql_runs_against_the_current_schema(database_url: str) -> None:
    blocks = operations_sql()
    assert len(blocks) == 5
    with psycopg.connect(database_url, autocommit=True) as conn:
        delivery_log_history(conn)  # a database that has run for over a month
        conn.execute(
            "INSERT INTO nq_delivery_log (id, idempotency_key, request_hash, channel, recipient,"
            " body, priority, status, send_at, next_attempt_at, max_attempts, finished_at) VALUES"
            " (gen_random_uuid(), 'old-sent', 'h', 'email', 'a@example.com', 'x', 1, 'SENT',"
            "  now(), now(), 6, now() - interval '40 days'),"
            " (gen_random_uuid(), 'new-dead', 'h', 'email', 'b@example.com', 'x', 1,"
            "  'DEAD_LETTERED', now(), now(), 6, now() - interval '1 day')"
        )
        conn.execute(
            "INSERT INTO nq_provider_circuits (provider, state, failures, open_until)"
            " VALUES ('sms-main', 'open', 5, now() + interval '1 hour')"
        )
        for _ in range(2):  # the archive job may run again: each partition is copied once
            for block in blocks:
                conn.execute(block)
        (partition,) = conn.execute(
            "SELECT tableoid::regclass::text FROM nq_delivery_log"
            " WHERE idempotency_key = 'old-sent'"
        ).fetchone() or (None,)
        archived = conn.execute(
            f"SELECT idempotency_key FROM nq_archive.{partition}"  # noqa: S608
        ).fetchall()
        recent_archived = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'nq_archive'"
            " AND tablename IN (to_char(now() - interval '1 day', '\"nq_delivery_log_\"YYYYMMDD'),"
            "                   to_char(now(), '\"nq_delivery_log_\"YYYYMMDD'))"
        ).fetchall()
        every_archived = {
            name
            for (name,) in conn.execute(
                "SELECT tablename::text FROM pg_tables WHERE schemaname = 'nq_archive'"
            ).fetchall()
        }
        circuit = conn.execute("SELECT state, failures FROM nq_provider_circuits").fetchone()
        # The job copies a day's partition once the day has been over for an hour: in the first
        # hour after midnight (UTC) yesterday's is not copied yet.
        (yesterday_copied,) = conn.execute(
            "SELECT now() - interval '1 hour'"
            " >= date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
        ).fetchone() or (None,)
    assert circuit == ("closed", 0)
    # The partition past the retention is archived (once); so is yesterday's, whose day is over
    # (after its hour), and today's, still being written, is not.
    assert archived == [("old-sent",)]
    yesterday = (datetime.now(UTC) - timedelta(days=1)).strftime("nq_delivery_log_%Y%m%d")
    assert [name for (name,) in recent_archived] == ([yesterday] if yesterday_copied else [])
    # Only days that held rows: not the month of empty days before them.
    assert every_archived == {partition} | ({yesterday} if yesterday_copied else set())


async def test_the_archive_job_copies_every_partition_retention_drops_day_after_day(
    database_url: str,
) -> None:
    (job,) = [b for b in operations_sql() if "nq_archive" in b]
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.nq_test_clock (t timestamptz NOT NULL)")
        conn.execute("INSERT INTO public.nq_test_clock VALUES (now())")
        conn.execute(
            "CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE sql STABLE"
            " AS 'SELECT t FROM public.nq_test_clock'"
        )
        (name,) = conn.execute("SELECT current_database()").fetchone() or ("",)
        conn.execute(f'ALTER DATABASE "{name}" SET search_path = public, pg_catalog')

    start = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    rows_of: dict[str, set[uuid.UUID]] = {}
    dropped: set[str] = set()
    with psycopg.connect(database_url, autocommit=True) as conn:

        def at(moment: datetime) -> None:
            conn.execute("UPDATE public.nq_test_clock SET t = %s", [moment])

        def finish_some(moment: datetime) -> None:
            """Three notifications finish now, in today's partition, with their keys."""
            ids = [uuid.uuid4() for _ in range(3)]
            conn.execute(
                """WITH rows AS (
                       INSERT INTO nq_delivery_log (id, idempotency_key, request_hash, channel,
                           recipient, body, priority, status, send_at, next_attempt_at,
                           max_attempts, finished_at)
                       SELECT i, i::text, 'h', 'email', 'a@example.com', 'b', 1, 'SENT',
                              %(t)s, %(t)s, 6, %(t)s
                       FROM unnest(%(ids)s::uuid[]) i
                       RETURNING id, idempotency_key)
                   INSERT INTO nq_idempotency_keys (key, notification_id, request_hash)
                   SELECT idempotency_key, id, 'h' FROM rows""",
                {"t": moment, "ids": ids},
            )
            rows_of.setdefault(moment.strftime("nq_delivery_log_%Y%m%d"), set()).update(ids)

        async with Database(database_url, pool_size=2) as db:
            keeper = DeliveryLogKeeper(DeliveryLogRepository(db), retention_days=3)

            async def retention(moment: datetime) -> None:
                at(moment)
                dropped.update(d.partition for d in await keeper.maintain())

            # Installed and first run on day 0: what exists then is the fresh database's days.
            at(start + timedelta(hours=3))
            conn.execute(job)
            existing_at_install = {
                n for (n,) in conn.execute("SELECT relname::text FROM pg_class").fetchall()
            }
            for day in range(18):
                midnight = start + timedelta(days=day)
                await retention(midnight + timedelta(minutes=30))  # hourly, just after midnight
                at(midnight + timedelta(hours=3))  # the daily job
                conn.execute(job)
                finish_some(midnight + timedelta(hours=10))
                await retention(midnight + timedelta(hours=20))
                finish_some(midnight + timedelta(hours=23, minutes=59))

        archived = {
            n
            for (n,) in conn.execute(
                "SELECT tablename::text FROM pg_tables WHERE schemaname = 'nq_archive'"
            ).fetchall()
        }
        created_later = {d for d in dropped if d not in existing_at_install}
        # Several days made after the job was installed went, and each that held rows went into
        # the archive; an empty day is not copied.
        assert len(created_later) >= 5
        with_rows = {d for d in dropped if rows_of.get(d)}
        assert len(with_rows & created_later) >= 5
        assert with_rows <= archived, sorted(with_rows - archived)
        assert all(rows_of.get(p) for p in archived), sorted(archived - set(rows_of))
        for partition in with_rows:
            copied = conn.execute(
                f"SELECT id FROM nq_archive.{partition}"  # noqa: S608
            ).fetchall()
            assert {i for (i,) in copied} == rows_of.get(partition, set()), partition
