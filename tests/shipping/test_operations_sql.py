"""The SQL in docs/operations.md (closing a provider's circuit by hand, re-sending failed webhook
events, autovacuum settings, archiving the delivery log's partitions before retention drops them,
pruning old events) runs against the current schema and does what the page says."""

from __future__ import annotations

import re

import psycopg

from tests.shipping.support import ROOT


def test_the_operations_sql_runs_against_the_current_schema(database_url: str) -> None:
    blocks = re.findall(r"```sql\n(.*?)```", (ROOT / "docs" / "operations.md").read_text(), re.S)
    assert len(blocks) == 5
    with psycopg.connect(database_url, autocommit=True) as conn:
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
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'nq_archive'"
            " AND tablename = to_char(now() - interval '1 day', '\"nq_delivery_log_\"YYYYMMDD')"
        ).fetchone()
        circuit = conn.execute("SELECT state, failures FROM nq_provider_circuits").fetchone()
    assert circuit == ("closed", 0)
    # The partition past the retention is archived (once); the recent one is not.
    assert archived == [("old-sent",)]
    assert recent_archived == (0,)
