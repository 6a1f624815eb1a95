"""Every row belongs to a tenant (docs/tenants.md): the column on each table that holds a
tenant's rows, `default` for every row written without one (the previous release's, and every
row while tenants are off); the insert paths carry a tenant through the queue and into the log;
and an idempotency key is a tenant's own."""

from __future__ import annotations

import dataclasses
import uuid

import psycopg

from notify_queue import jsontext
from notify_queue.models import client_key
from notify_queue.repositories.db import Database
from notify_queue.repositories.notifications import enqueue_item
from tests.chaos.harness import read_rows
from tests.support import new

TENANT_TABLES = (
    "nq_jobs",
    "nq_delivery_log",
    "nq_escalations",
    "nq_digests",
)


async def test_every_tenant_table_has_the_column_not_null_with_default(db: Database) -> None:
    rows = await read_rows(
        db,
        "SELECT table_name, data_type, is_nullable, column_default"
        " FROM information_schema.columns"
        " WHERE column_name = 'tenant' AND table_name = ANY(%(tables)s)",
        {"tables": list(TENANT_TABLES)},
    )
    found = {r["table_name"]: r for r in rows}
    assert set(found) == set(TENANT_TABLES)
    for table, r in found.items():
        assert (r["data_type"], r["is_nullable"]) == ("text", "NO"), table
        assert r["column_default"] == "'default'::text", table


async def test_the_insert_paths_carry_the_tenant_and_keys_are_per_tenant(
    db: Database, database_url: str
) -> None:
    key = uuid.uuid4().hex
    plain = dataclasses.replace(new(), idempotency_key=key)
    theirs = dataclasses.replace(new(), idempotency_key=key, tenant="team-a")
    mine = dataclasses.replace(new(), idempotency_key=key, tenant="team-b")
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        for statement, n in (
            ("SELECT id FROM nq_enqueue_pending(%s::json, 6, false)", plain),
            ("SELECT id FROM nq_enqueue_pending(%s::json, 6, false)", theirs),
            ("SELECT id FROM nq_insert_notifications(%s::json, 6, NULL)", mine),
        ):
            item = enqueue_item(0, n) | {"status": "PENDING"}
            cursor = await conn.execute(statement, (jsontext.dumps_text([item]),))
            # The same key in another tenant is a new notification, not the first one's.
            assert [r[0] for r in await cursor.fetchall()] == [n.id]
    rows = await read_rows(
        db,
        "SELECT id, tenant, idempotency_key FROM nq_jobs WHERE id = ANY(%(ids)s)",
        {"ids": [plain.id, theirs.id, mine.id]},
    )
    assert {r["id"]: r["tenant"] for r in rows} == {
        plain.id: "default",
        theirs.id: "team-a",
        mine.id: "team-b",
    }
    assert {client_key(r["idempotency_key"]) for r in rows} == {key}
    # Moved to the log (finished) and back (retried), a row keeps its tenant.
    await read_rows(
        db,
        "SELECT count(*) FROM nq_finish_held(ARRAY[%(id)s]::uuid[], NULL, ARRAY['FAILED'],"
        " NULL, NULL, NULL, NULL, NULL, NULL)",
        {"id": theirs.id},
    )
    logged = await read_rows(
        db, "SELECT tenant FROM nq_delivery_log WHERE id = %(id)s", {"id": theirs.id}
    )
    assert [r["tenant"] for r in logged] == ["team-a"]
    await read_rows(db, "SELECT count(*) FROM nq_retry(ARRAY[%(id)s]::uuid[])", {"id": theirs.id})
    queued = await read_rows(db, "SELECT tenant FROM nq_jobs WHERE id = %(id)s", {"id": theirs.id})
    assert [r["tenant"] for r in queued] == ["team-a"]
