"""notify_queue_enqueue in the caller's transaction: a rollback leaves nothing and wakes nobody,
a commit is delivered by a real worker process; repeats and conflicts of a key; recipientId
expansion; what only the API can do (templates); and the role notify_queue_enqueue, which may
call the function and touch no table."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from notify_queue.client import enqueue, enqueue_async
from notify_queue.errors import Conflict, ValidationFailed
from tests.api.support import api_client
from tests.enqueue.support import call_function
from tests.support import eventually

RECEIPT = {"channel": "email", "recipient": "ana@example.com", "subject": "Receipt", "body": "€"}


def _count(database_url: str, key: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM nq_all_notifications WHERE idempotency_key LIKE %s)"
            " + (SELECT count(*) FROM nq_idempotency_keys WHERE key LIKE %s)",
            [key + "%", key + "%"],
        ).fetchone()
        assert row is not None
        return int(row[0])


def _wakeups_before_marker(database_url: str, act: Any) -> list[str]:
    """The nq_wakeup payloads delivered while `act` runs, up to a marker sent after it: events
    from one session arrive in commit order, so whatever `act` committed comes before it."""
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN nq_wakeup")
        act()
        marker = uuid.uuid4().hex
        with psycopg.connect(database_url, autocommit=True) as other:
            other.execute("SELECT pg_notify('nq_wakeup', %s)", [marker])
        seen = []
        for note in listener.notifies(timeout=60):
            if note.payload == marker:
                return seen
            seen.append(note.payload)
    raise AssertionError("the marker never arrived")


def test_a_rolled_back_transaction_leaves_nothing_and_wakes_no_worker(database_url: str) -> None:
    key = f"order-{uuid.uuid4().hex}"

    def act() -> None:
        with psycopg.connect(database_url) as conn:
            made = enqueue(conn, idempotency_key=key, **RECEIPT)
            assert made["status"] == "PENDING"
            conn.rollback()

    assert _wakeups_before_marker(database_url, act) == []
    assert _count(database_url, key) == 0


@pytest.fixture
def worker_process(database_url: str, tmp_path: Path) -> Iterator[None]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFY_QUEUE_")}
    log = (tmp_path / "worker.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "notify_queue", "worker", "--database-url", database_url,
         "--provider", "simulated", "--log-level", "WARNING"],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        yield
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        log.close()


async def test_a_committed_enqueue_wakes_workers_and_a_real_worker_sends_it(
    database_url: str, worker_process: None
) -> None:
    key = f"order-{uuid.uuid4().hex}"
    made: dict[str, Any] = {}

    def act() -> None:
        with psycopg.connect(database_url) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS shop_orders (id text PRIMARY KEY)")
            conn.execute("INSERT INTO shop_orders VALUES (%s)", [key])
            made.update(enqueue(conn, idempotency_key=key, **RECEIPT))
            conn.commit()

    assert _wakeups_before_marker(database_url, act) == [""]

    async def sent() -> bool:
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            cur = await conn.execute(
                "SELECT status FROM nq_all_notifications WHERE id = %s", [made["id"]]
            )
            row = await cur.fetchone()
            return row is not None and row[0] == "SENT"

    await eventually(sent, timeout=60, what="the enqueued receipt SENT by the worker")


async def test_the_answer_is_what_the_api_answers_for_the_same_notification(
    database_url: str,
) -> None:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        later = "2999-01-01T00:00:00Z"
        made = await enqueue_async(
            conn, idempotency_key="same-shape", metadata={"order": 7}, send_at=later, **RECEIPT
        )
        await conn.commit()
    async with api_client(database_url) as http:
        read = (await http.get(f"/notifications/{made['id']}")).json()
    assert made == read
    assert made["source"] == "sql"


def test_a_repeat_answers_the_original_and_another_request_under_the_key_is_23505(
    database_url: str,
) -> None:
    with psycopg.connect(database_url) as conn:
        first = call_function(conn, RECEIPT, "repeat-1")
        again = call_function(conn, {**RECEIPT}, "repeat-1")
        assert again == first
        with pytest.raises(psycopg.errors.UniqueViolation, match=str(first["id"])):
            call_function(conn, {**RECEIPT, "body": "other"}, "repeat-1")
        conn.rollback()
        with pytest.raises(Conflict):
            enqueue(conn, idempotency_key="repeat-2", **RECEIPT)
            enqueue(conn, idempotency_key="repeat-2", **{**RECEIPT, "body": "other"})


async def test_a_key_first_used_through_the_api_repeats_through_the_function(
    database_url: str,
) -> None:
    body = {**RECEIPT, "metadata": {"b": [1, "x\n"], "a": 1.5}}
    async with api_client(database_url) as http:
        created = await http.post("/notifications", json=body, headers={"Idempotency-Key": "k1"})
        assert created.status_code == 201
    with psycopg.connect(database_url) as conn:
        assert call_function(conn, body, "k1")["id"] == created.json()["id"]


def test_an_invalid_request_raises_22023_naming_the_field(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="recipient: must be an"):
            call_function(conn, {**RECEIPT, "recipient": "nobody"}, "bad-1")
        conn.rollback()
        with pytest.raises(ValidationFailed) as failed:
            enqueue(conn, idempotency_key="bad-2", **{**RECEIPT, "delay_seconds": -1})
        assert [(e.field, e.message) for e in failed.value.errors] == [
            ("delaySeconds", "Input should be greater than or equal to 0")
        ]


def test_a_template_is_refused_as_not_supported_in_sql(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="not supported in SQL"):
            call_function(
                conn, {"channel": "email", "recipient": "a@example.com", "template": "t"}, "t-1"
            )


def _recipient(conn: psycopg.Connection[Any], id: str, **columns: Any) -> None:
    names = ["id", *columns]
    conn.execute(
        f"INSERT INTO nq_recipients ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))})",  # noqa: S608
        [id, *columns.values()],
    )


async def test_a_recipient_id_expands_over_the_channels_as_the_api_does(
    database_url: str,
) -> None:
    with psycopg.connect(database_url) as conn:
        _recipient(conn, "u1", email="u1@example.com", phone="+4915112345678",
                   opt_out_channels=["sms"])  # fmt: skip
        _recipient(conn, "u2", email="u2@example.com", opt_out_all=True)
        conn.commit()
        many = call_function(conn, {"recipientId": "u1", "body": "hi"}, "r-1")
        none = call_function(conn, {"recipientId": "u2", "body": "hi"}, "r-2")
        again = call_function(conn, {"recipientId": "u1", "body": "hi"}, "r-1")
        conn.commit()
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="no recipient with id u9"):
            call_function(conn, {"recipientId": "u9", "body": "hi"}, "r-3")
    async with api_client(database_url) as http:
        api_many = (
            await http.post("/notifications", json={"recipientId": "u1", "body": "hi"},
                            headers={"Idempotency-Key": "a-1"})
        ).json()  # fmt: skip
        api_none = (
            await http.post("/notifications", json={"recipientId": "u2", "body": "hi"},
                            headers={"Idempotency-Key": "a-2"})
        ).json()  # fmt: skip

    def shape(answer: dict[str, Any]) -> list[tuple[str, str, str, str | None]]:
        return [
            (n["channel"], n["recipient"], n["status"], n["lastError"])
            for n in answer["notifications"]
        ]

    assert shape(many) == shape(api_many) == [("email", "u1@example.com", "PENDING", None)]
    assert shape(none) == shape(api_none)
    assert none["notifications"][0]["status"] == "SUPPRESSED"
    assert again == many


def test_the_enqueue_role_may_call_the_function_and_touch_no_table(database_url: str) -> None:
    user = f"app_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {user} LOGIN")
        admin.execute(f"GRANT notify_queue_enqueue TO {user}")
        tables = [
            r[0]
            for r in admin.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            ).fetchall()
        ]
    try:
        with psycopg.connect(database_url, user=user, autocommit=True) as app:
            assert app.execute("SELECT current_user").fetchone() == (user,)
            made = call_function(app, RECEIPT, "role-1")
            assert made["status"] == "PENDING"
            assert "nq_jobs" in tables and "nq_idempotency_keys" in tables
            for table in tables:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    app.execute(f"SELECT 1 FROM {table} LIMIT 1")  # noqa: S608
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute("INSERT INTO nq_jobs (id) VALUES (gen_random_uuid())")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute("DELETE FROM nq_idempotency_keys")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute("SELECT * FROM nq_all_notifications")
            # The insert the function uses runs with the caller's rights when called directly.
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute("SELECT * FROM nq_insert_notifications('[]', 6, NULL)")
        with psycopg.connect(database_url) as admin:
            row = admin.execute(
                "SELECT source FROM nq_all_notifications WHERE id = %s", [made["id"]]
            ).fetchone()
            assert row == ("sql",)
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(f"DROP ROLE {user}")


def test_public_cannot_execute_the_function(database_url: str) -> None:
    user = f"nobody_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {user} LOGIN")
    try:
        with psycopg.connect(database_url, user=user) as app:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute("SELECT notify_queue_enqueue(%s, 'x')", [Jsonb(RECEIPT)])
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(f"DROP ROLE {user}")
