"""The SQL in docs/operations.md (closing a provider's circuit by hand, re-sending failed webhook
events, autovacuum settings, the archive and its batch move) runs against the current schema and
does what the page says."""

from __future__ import annotations

import re

import psycopg

from tests.shipping.support import ROOT


def test_the_operations_sql_runs_against_the_current_schema(database_url: str) -> None:
    blocks = re.findall(r"```sql\n(.*?)```", (ROOT / "docs" / "operations.md").read_text(), re.S)
    assert len(blocks) == 4
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO nq_notifications (id, idempotency_key, request_hash, channel, recipient,"
            " body, priority, status, send_at, next_attempt_at, max_attempts, created_at) VALUES"
            " (gen_random_uuid(), 'old-sent', 'h', 'email', 'a@example.com', 'x', 1, 'SENT',"
            "  now(), now(), 6, '2026-09-02T00:00:00Z'),"
            " (gen_random_uuid(), 'old-dead', 'h', 'email', 'b@example.com', 'x', 1,"
            "  'DEAD_LETTERED', now(), now(), 6, '2026-09-02T00:00:00Z')"
        )
        conn.execute(
            "INSERT INTO nq_provider_circuits (provider, state, failures, open_until)"
            " VALUES ('sms-main', 'open', 5, now() + interval '1 hour')"
        )
        for block in blocks:
            conn.execute(block)
        archived = conn.execute("SELECT idempotency_key FROM nq_notifications_archive").fetchall()
        kept = conn.execute("SELECT idempotency_key FROM nq_notifications").fetchall()
        circuit = conn.execute("SELECT state, failures FROM nq_provider_circuits").fetchone()
    assert circuit == ("closed", 0)
    # The old SENT row moved to the archive; a dead letter stays until someone decides.
    assert archived == [("old-sent",)]
    assert kept == [("old-dead",)]
