"""What Citus refuses in the current schema and SQL (docs/scaling.md, "Citus: what the current
schema meets"), found again on a fresh local cluster and printed as Markdown lists.

    .venv/bin/python scripts/citus-refusals.py [--reference t1,t2,...]

Starts a coordinator and two worker nodes (tests/citus/cluster.py; Citus built by `make citus`),
runs `notify-queue migrate` on the coordinator twice, adds a `bucket` column where the schema has
none, distributes the per-notification tables by it (co-located with the queue), the idempotency
keys by key, makes the small tables reference tables, applying after each refusal the smallest
workaround to see the next one; then runs every named query (repositories/sql/*.sql and
citus/statements.sql) once with a seeded notification and plausible parameters, each in a
transaction that is rolled back. Nothing here changes the schema in the repository: it tells
what to reshape, and re-checks a reshaping.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.citus.cluster import CitusUnavailable, running_cluster  # noqa: E402
from tests.support import directory_outside_pytest  # noqa: E402

from notify_queue.repositories.queries import QUERIES  # noqa: E402

# (table, distribution column, colocate_with); "QUEUE" is the unfinished rows' table, nq_jobs
# from migration 0012 on (nq_queue before). Tables the schema does not have are left out.
DISTRIBUTED = [
    ("QUEUE", "bucket", None),
    ("nq_delivery_log", "bucket", "QUEUE"),
    ("nq_webhook_events", "bucket", "QUEUE"),
    ("nq_rate_slots", "bucket", "QUEUE"),
    ("nq_rate_windows", "bucket", "QUEUE"),
    ("nq_idempotency_keys", "key", "none"),
]
REFERENCE = [
    "nq_policies",
    "nq_templates",
    "nq_recipients",
    "nq_provider_circuits",
    "nq_provider_schedule",
    "nq_counters",
    "nq_kube_links",
    "nq_status_outbox",
]
PARAMETER = re.compile(r"%\((\w+)\)([sb])(?:::(\w+)(\[\])?)?")


def error_text(e: psycopg.Error) -> str:
    d = e.diag
    text = d.message_primary or str(e)
    if d.message_detail:
        text += f" DETAIL: {d.message_detail}"
    if d.message_hint:
        text += f" HINT: {d.message_hint}"
    if d.context:
        text += f" CONTEXT: {d.context.splitlines()[0][:160]}"
    return text


class Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def attempt(self, conn: psycopg.Connection[Any], sql: str, params: Any = None) -> str | None:
        try:
            conn.execute(sql, params)
        except psycopg.Error as e:
            self.lines.append(f"- refused: `{sql}`\n  -> {error_text(e)}")
            return error_text(e)
        self.lines.append(f"- ok: `{sql}`")
        return None


def lay_out(conn: psycopg.Connection[Any], log: Log, reference: list[str]) -> None:
    def table_exists(name: str) -> bool:
        found = conn.execute(
            "SELECT FROM pg_class WHERE relname = %s AND relkind IN ('r', 'p')", [name]
        ).fetchone()
        return found is not None

    queue = "nq_jobs" if table_exists("nq_jobs") else "nq_queue"
    plan = [
        (queue if t == "QUEUE" else t, c, queue if o == "QUEUE" else o)
        for t, c, o in DISTRIBUTED
        if table_exists(queue if t == "QUEUE" else t)
    ]
    reference = [t for t in reference if table_exists(t)]

    def column_type(table: str, column: str) -> str | None:
        found = conn.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = %s::regclass AND attname = %s AND NOT attisdropped",
            [table, column],
        ).fetchone()
        return found[0] if found else None

    # Co-located tables need the same type: the queue's bucket type where the schema has one.
    bucket_type = column_type(queue, "bucket") or "integer"
    for table, column, _ in plan:
        if column_type(table, column) is None:
            log.attempt(
                conn, f"ALTER TABLE {table} ADD COLUMN {column} {bucket_type} NOT NULL DEFAULT 0"
            )
    for table, column, colocate in plan:
        args = f"'{table}', '{column}'" + (f", colocate_with => '{colocate}'" if colocate else "")
        for _ in range(6):
            error = log.attempt(conn, f"SELECT create_distributed_table({args})")
            if error is None:
                break
            if "UNIQUE" in error or "PRIMARY KEY" in error:
                widen_unique_constraints(conn, log, table, column)
            elif "trigger" in error:
                log.attempt(conn, "SET citus.enable_unsafe_triggers = on")
            else:
                break
    for table in reference:
        log.attempt(conn, f"SELECT create_reference_table('{table}')")


def widen_unique_constraints(
    conn: psycopg.Connection[Any], log: Log, table: str, column: str
) -> None:
    """The workaround to see past the constraint error: each key gains the distribution column."""
    rows = conn.execute(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = %s::regclass AND contype IN ('p', 'u')",
        [table],
    ).fetchall()
    for name, definition in rows:
        if column in definition:
            continue
        columns = re.search(r"\((.*)\)", definition)
        assert columns is not None
        kind = "PRIMARY KEY" if definition.startswith("PRIMARY") else "UNIQUE"
        log.attempt(
            conn,
            f"ALTER TABLE {table} DROP CONSTRAINT {name},"
            f" ADD CONSTRAINT {name} {kind} ({column}, {columns[1]})",
        )


def parameters(
    name: str, sql: str, now: dt.datetime, seeded: uuid.UUID, partition: str
) -> dict[str, Any]:
    element = {
        "uuid": seeded,
        "text": "email",
        "smallint": 1,
        "int": 1,
        "integer": 1,
        "float8": 1.0,
        "bool": False,
        "timestamptz": now,
        "bigint": 1,
    }
    scalar: dict[str, Any] = {
        "id": seeded,
        "notification_id": seeded,
        "claim_token": seeded,
        "probe_token": seeded,
        "after": seeded,
        "limit": 10,
        "status": "FAILED",
        "name": "n",
        "namespace": "ns",
        "uid": "u1",
        "provider": "p",
        "key": 42,
        "recipient": "a@example.com",
        "recipient_id": "r1",
        "channel": "email",
        "version": 99,
        "generation": 1,
        "phase": "expand",
        "release": "0.0.0",
        "partition": partition,
        "webhook_secrets": [],
        "source": "api",
        "timezone": "UTC",
        "push_tokens": [],
        "opt_out_channels": [],
        "opt_out_categories": [],
        "opt_out_all": False,
        "channels": ["email"],
        "failover": "OnDefiniteFailure",
        "ready": True,
        "after_created_at": now,
        "wanted": 2,
        "items": seed_items(uuid.uuid4(), "k-query", now),
    }
    if name.startswith("recipient_"):
        scalar["id"] = "r1"
    if name == "template_put":
        scalar["channels"] = json.dumps({"email": {"body": "x"}})
    values: dict[str, Any] = {}
    for m in PARAMETER.finditer(sql):
        key, binary, cast = m[1], m[2] == "b", m[3]
        if binary:
            values[key] = [element.get(cast or "text", "x")]
        elif key in scalar:
            values[key] = scalar[key]
        elif key.endswith("seconds") or key.startswith("backoff"):
            values[key] = 60.0
        elif key.startswith(("max_", "rate_limit", "default_max")) or key.endswith("ahead"):
            values[key] = 3
        else:
            values[key] = None
    return values


def seed_items(id: uuid.UUID, key: str, now: dt.datetime) -> str:
    return json.dumps(
        [
            {
                "position": 0,
                "id": str(id),
                "idempotency_key": key,
                "request_hash": "h",
                "channel": "email",
                "recipient": "a@example.com",
                "subject": None,
                "body": "b",
                "priority": 1,
                "send_at": now.isoformat(),
                "expires_at": None,
                "source": "api",
                "policy": None,
                "webhook_url": None,
                "metadata": {},
                "status": "PENDING",
                "last_error": None,
                "category": "general",
                "recipient_id": None,
                "template_name": None,
                "template_version": None,
            }
        ]
    )


def run_queries(conn: psycopg.Connection[Any]) -> list[str]:
    now = dt.datetime.now(dt.UTC)
    seeded = uuid.uuid4()
    conn.execute(
        QUERIES["notification_insert_many"],
        {
            "items": seed_items(seeded, "k-seed", now),
            "default_max_attempts": 3,
            "default_webhook_url": None,
        },
    )
    row = conn.execute(
        "SELECT inhrelid::regclass::text FROM pg_inherits"
        " WHERE inhparent = 'nq_delivery_log'::regclass ORDER BY 1 LIMIT 1"
    ).fetchone()
    partition = row[0] if row else "nq_delivery_log_none"
    lines = []
    for name, sql in QUERIES.items():
        text = sql.replace("{partition}", partition)
        try:
            with conn.transaction(force_rollback=True):
                conn.execute(text, parameters(name, sql, now, seeded, partition))
        except psycopg.Error as e:
            lines.append(f"- refused: `{name}` -> {error_text(e)}")
        else:
            lines.append(f"- ok: `{name}`")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--reference",
        default=",".join(REFERENCE),
        help="tables made reference tables (the rest stay on the coordinator)",
    )
    args = parser.parse_args()
    reference = [t for t in args.reference.split(",") if t]
    try:
        with directory_outside_pytest("notify-queue-citus-refusals-") as root:
            with running_cluster(root) as cluster:
                url = cluster.url()
                print("## migrate on the coordinator\n")
                for _ in range(2):
                    run = subprocess.run(
                        [
                            str(REPO / ".venv" / "bin" / "notify-queue"),
                            "migrate",
                            "--database-url",
                            url,
                        ],
                        capture_output=True,
                        text=True,
                        check=False,
                    )
                    print(f"- exit {run.returncode}: {(run.stdout or run.stderr).strip()[-300:]}")
                log = Log()
                with psycopg.connect(url, autocommit=True) as conn:
                    lay_out(conn, log, reference)
                    print("\n## distributing\n")
                    print("\n".join(log.lines))
                    conn.execute("SET citus.enable_unsafe_triggers = on")
                    print("\n## named queries\n")
                    print("\n".join(run_queries(conn)))
    except CitusUnavailable as reason:
        print(reason, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
