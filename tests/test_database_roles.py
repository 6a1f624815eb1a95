"""The database roles and what each may do (docs/security.md, "The database: roles and
privileges"; docs/operations.md, "Database roles").

- `notify_queue_enqueue` may execute the enqueue function and no other function of the schema,
  also one the migrating user makes later (the default privileges `migrate` leaves).
- The enqueue function's defaults come from the database (nq_enqueue_defaults, written by
  `migrate` from its configuration), never from settings a caller sets in its session.
- `notify_queue_runtime` has data rights only: the real `notify-queue api` and `worker`
  processes, logged in as a member of it, create and deliver a notification; the same login may
  not create, drop or alter anything in the schema.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from notify_queue.repositories.db import Database
from notify_queue.repositories.schema import EnqueueDefaults, migrate
from tests.receivers import WebhookReceiver
from tests.support import eventually, running_api

REQUEST = {"channel": "email", "recipient": "a@example.com", "body": "hello"}
OPTED_OUT = "INSERT INTO nq_recipients (id, email, opt_out_all) VALUES ('r1', 'r@x', true)"


def executable_by(conn: psycopg.Connection[Any], role: str) -> list[str]:
    """Every function of the schema `role` may execute."""
    rows = conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p"
        " WHERE p.pronamespace = current_schema()::regnamespace"
        "   AND has_function_privilege(%s, p.oid, 'EXECUTE') ORDER BY 1",
        [role],
    ).fetchall()
    return [r[0] for r in rows]


@contextlib.contextmanager
def login_in(database_url: str, group: str) -> Iterator[str]:
    """A new login role granted into `group`; the database's URL as that role."""
    user = f"app_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {user} LOGIN")
        admin.execute(f"GRANT {group} TO {user}")
    params = conninfo_to_dict(database_url)
    params["user"] = user
    params.pop("password", None)
    try:
        yield make_conninfo("", **params)
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                [user],
            )
            admin.execute(f"DROP OWNED BY {user}")
            admin.execute(f"DROP ROLE {user}")


def test_the_enqueue_role_can_execute_exactly_the_enqueue_function(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        assert executable_by(conn, "notify_queue_enqueue") == ["notify_queue_enqueue(jsonb,text)"]


def test_a_function_the_migrating_user_makes_later_is_not_executable_by_public(
    database_url: str,
) -> None:
    """As citus/functions.sql's, (re)made on every `migrate`: the default privileges of the
    migrating user leave PUBLIC out."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION nq_made_later() RETURNS integer LANGUAGE sql RETURN 1")
        assert "nq_made_later()" not in executable_by(conn, "notify_queue_enqueue")
        assert "nq_made_later()" in executable_by(conn, "notify_queue_runtime")


def test_a_session_setting_changes_none_of_the_enqueue_defaults(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SET notify_queue.max_attempts = '1'")
        conn.execute("SET notify_queue.webhook_url = 'https://attacker.example/hooks'")
        row = conn.execute(
            "SELECT notify_queue_enqueue(%s::jsonb, 'session-1')", [json.dumps(REQUEST)]
        ).fetchone()
        assert row is not None
        assert row[0]["maxAttempts"] == 6
        # A recipient who opted out of everything: the event's URL is the default webhook's.
        conn.execute(OPTED_OUT)
        conn.execute(
            "SELECT notify_queue_enqueue(%s::jsonb, 'session-2')",
            [json.dumps({"recipientId": "r1", "body": "hi"})],
        )
        urls = conn.execute("SELECT DISTINCT url FROM nq_webhook_events").fetchall()
        assert urls == []  # no default webhook configured: no event, and none to the session's


async def test_migrate_writes_the_enqueue_defaults_it_is_configured_with(
    database_url: str,
) -> None:
    async with Database(database_url, pool_size=1) as db:
        await migrate(
            db,
            enqueue_defaults=EnqueueDefaults(
                max_attempts=9, webhook_url="https://hooks.example/nq", webhook_url_given=True
            ),
        )
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT notify_queue_enqueue(%s::jsonb, 'configured-1')", [json.dumps(REQUEST)]
        ).fetchone()
        assert row is not None and row[0]["maxAttempts"] == 9
        conn.execute(OPTED_OUT)
        conn.execute(
            "SELECT notify_queue_enqueue(%s::jsonb, 'configured-2')",
            [json.dumps({"recipientId": "r1", "body": "hi"})],
        )
        urls = conn.execute("SELECT DISTINCT url FROM nq_webhook_events").fetchall()
        assert urls == [("https://hooks.example/nq",)]
    # A `migrate` not given them keeps them.
    async with Database(database_url, pool_size=1) as db:
        await migrate(db)
    with psycopg.connect(database_url) as conn:
        assert conn.execute(
            "SELECT max_attempts, webhook_url FROM nq_enqueue_defaults"
        ).fetchall() == [(9, "https://hooks.example/nq")]


@contextlib.contextmanager
def worker(url: str, provider_url: str, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFY_QUEUE_")}
    command = [sys.executable, "-m", "notify_queue", "worker", "--database-url", url]
    command += ["--provider", "http", "--provider-url", provider_url, "--poll-interval", "0.2"]
    command += ["--log-level", "WARNING"]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield process
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def test_the_runtime_role_runs_the_api_and_a_worker_and_cannot_change_the_schema(
    database_url: str, tmp_path: Path
) -> None:
    await runtime_role_runs_the_api_and_a_worker(database_url, tmp_path)


async def runtime_role_runs_the_api_and_a_worker(database_url: str, tmp_path: Path) -> None:
    """The scenario, on plain PostgreSQL here and on Citus (tests/citus/test_database_roles.py):
    a login in the runtime group creates and delivers, retention retires the expired partitions,
    and that login may change nothing in the schema."""
    provider = await WebhookReceiver().start()
    try:
        with login_in(database_url, "notify_queue_runtime") as url:
            async with (
                running_api(url, tmp_path / "api.log") as base,
                httpx.AsyncClient(base_url=base, timeout=60) as http,
            ):
                made = await http.post(
                    "/notifications", json=REQUEST, headers={"Idempotency-Key": "runtime-1"}
                )
                assert made.status_code == 201, made.text
                with worker(url, provider.url, tmp_path / "worker.log") as process:

                    async def sent() -> bool:
                        assert process.poll() is None, (tmp_path / "worker.log").read_text()
                        got = await http.get(f"/notifications/{made.json()['id']}")
                        return bool(got.json()["status"] == "SENT")

                    await eventually(sent, timeout=60)

                    # Retention (30 days) retired the older partitions, as the log's owner.
                    async def retired() -> bool:
                        with psycopg.connect(url) as conn:
                            expired = conn.execute(
                                "SELECT * FROM nq_delivery_log_expired(interval '30 days')"
                            ).fetchall()
                        return expired == []

                    await eventually(retired, timeout=60)
                assert [r.json["id"] for r in provider.received] == [made.json()["id"]]
                assert "Traceback" not in (tmp_path / "worker.log").read_text()

            with psycopg.connect(url, autocommit=True) as app:
                for ddl in (
                    "CREATE TABLE nq_mine (id integer)",
                    "DROP TABLE nq_jobs",
                    "ALTER TABLE nq_jobs ADD COLUMN mine integer",
                    "CREATE FUNCTION nq_mine() RETURNS integer LANGUAGE sql RETURN 1",
                    "DROP FUNCTION notify_queue_enqueue(jsonb, text)",
                    "TRUNCATE nq_jobs",
                ):
                    with pytest.raises(psycopg.errors.InsufficientPrivilege):
                        app.execute(ddl)
                # The one drop it may have done as the owner: the log's expired day partitions.
                with pytest.raises(psycopg.errors.InvalidParameterValue):
                    app.execute("SELECT nq_delivery_log_retire('nq_jobs')")
    finally:
        await provider.stop()
