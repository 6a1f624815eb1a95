"""The product through a real PgBouncer in transaction mode (Debian's `pgbouncer`).

How people run PostgreSQL in a cluster: a transaction-mode pooler in front of the primary
(examples/cloudnativepg/). Here a plain `pgbouncer` process stands in front of the embedded
PostgreSQL with the example's `default_pool_size`. `notify-queue migrate` runs on the direct URL
(its session-level lock needs one session: docs/operations.md, "PgBouncer"); the API and two
workers run through the pooler with `--database-prepared-statements off` (PgBouncer 1.18 keeps no
prepared statements), the workers' LISTEN connection direct (`--listen-database-url`). The test
counts: every create answered 201, every notification SENT with one attempt, a notification
created while the workers sleep claimed on its wake-up (their poll interval is 600 s, longer
than the test may take), and PgBouncer's server connections (sampled every 50 ms on its admin
console) never above the pool size the example gives.

Negative controls, by hand (docs/operations.md records them): without --listen-database-url the
wake-up test waits out its deadline (LISTEN through the pooler hears nothing); with prepared
statements on, creates start failing with 'prepared statement "_pg3_0" does not exist'.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from notify_queue.embedded import EmbeddedPostgres
from tests.chaos.harness import WorkerProcesses
from tests.pooling.pgbouncer import PgBouncer, pgbouncer_binary
from tests.support import directory_outside_pytest, eventually, free_port, missing_component

ROOT = Path(__file__).resolve().parents[2]
POOLER = ROOT / "examples" / "cloudnativepg" / "pooler.yaml"
# Longer than the test may take: any claim after the first poll came from a wake-up.
POLL_INTERVAL_SECONDS = 600
CREATES = 200


def example_pool_size() -> int:
    """The server connections per database and user the example's Pooler allows."""
    pooler = yaml.safe_load(POOLER.read_text())
    return int(pooler["spec"]["pgbouncer"]["parameters"]["default_pool_size"])


@pytest.fixture
def pooled(pg_server: EmbeddedPostgres) -> Iterator[tuple[PgBouncer, str]]:
    """An empty database and a password role of its own, PgBouncer in front: (pooler, the
    direct URL)."""
    binary = pgbouncer_binary()
    if binary is None:
        missing_component("pgbouncer", "scripts/install-test-packages.sh installs it (apt)")
    suffix = uuid.uuid4().hex[:8]
    database, user, password = f"pool_{suffix}", f"nq_pool_{suffix}", f"pw-{suffix}"
    admin_url = pg_server.url()
    socket_dir = psycopg.conninfo.conninfo_to_dict(admin_url)["host"]
    assert isinstance(socket_dir, str)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {user} LOGIN CREATEROLE PASSWORD '{password}'")
        conn.execute(f"CREATE DATABASE {database} OWNER {user}")
        row = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", [user])
        (secret,) = row.fetchone() or ("",)
    direct = f"postgresql://{user}:{password}@/{database}?host={socket_dir}"
    with directory_outside_pytest("nq-pgbouncer-") as work_dir:
        bouncer = PgBouncer(
            binary,
            work_dir,
            socket_dir,
            database,
            user,
            password,
            default_pool_size=example_pool_size(),
            run_as=pg_server.system_user if os.geteuid() == 0 else None,
        )
        try:
            bouncer.start(secret)
            yield bouncer, direct
        finally:
            bouncer.stop()
            with psycopg.connect(admin_url, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
                conn.execute(f"DROP OWNED BY {user}")
                conn.execute(f"DROP ROLE IF EXISTS {user}")


@pytest.fixture
async def processes(
    pooled: tuple[PgBouncer, str], tmp_path: Path
) -> AsyncIterator[WorkerProcesses]:
    bouncer, _ = pooled
    group = WorkerProcesses(bouncer.url, tmp_path)
    try:
        yield group
    finally:
        group.close()
        print(bouncer.log()[-3000:])


async def test_the_product_runs_through_a_transaction_mode_pgbouncer(
    pooled: tuple[PgBouncer, str], processes: WorkerProcesses
) -> None:
    bouncer, direct = pooled
    pool_size = example_pool_size()

    # Migrations: on the direct URL, as the chart's migration Job (docs/operations.md).
    migrated = subprocess.run(
        [sys.executable, "-m", "notify_queue", "migrate", "--database-url", direct],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert migrated.returncode == 0, migrated.stderr
    assert "schema up to date" in migrated.stdout

    port = free_port()
    pooled_flags = ["--database-prepared-statements", "off"]
    api = processes.start_api(port, *pooled_flags)
    worker_flags = [
        *pooled_flags,
        "--listen-database-url",
        direct,
        "--poll-interval",
        str(POLL_INTERVAL_SECONDS),
        "--rate-limit",
        "1000000",
        "--log-level",
        "INFO",
    ]
    workers = [processes.start(*worker_flags) for _ in range(2)]
    await processes.ready(*workers)
    base = f"http://127.0.0.1:{port}"

    async def api_ready() -> bool:
        assert api.poll() is None, processes.log(api)
        try:
            async with httpx.AsyncClient(base_url=base) as http:
                return (await http.get("/readyz")).status_code == 200
        except httpx.TransportError:
            return False

    await eventually(api_ready, timeout=60, what="the API is ready through the pooler")

    most_servers = 0
    sampling = True

    async def sample_servers() -> None:
        nonlocal most_servers
        while sampling:
            servers = await asyncio.to_thread(bouncer.show, "SERVERS")
            most_servers = max(most_servers, len(servers))
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample_servers())
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        # Creates, many at a time, so the API's pool opens more client connections than the
        # pooler has server connections.
        limit = asyncio.Semaphore(16)

        async def create(i: int) -> tuple[int, dict[str, Any]]:
            body = {
                "channel": ["email", "sms", "push"][i % 3],
                "recipient": ["a@example.com", "+4915112345678", "device-token"][i % 3]
                if i % 3
                else f"user{i}@example.com",
                "body": f"message {i}",
                "priority": ["HIGH", "NORMAL", "LOW"][i % 3],
            }
            async with limit:
                r = await http.post(
                    "/notifications", json=body, headers={"Idempotency-Key": f"pool-{i}"}
                )
            return r.status_code, r.json()

        created = await asyncio.gather(*(create(i) for i in range(CREATES)))
        assert [s for s, _ in created] == [201] * CREATES, [b for s, b in created if s != 201][:3]
        ids = [b["id"] for _, b in created]

        async def all_sent() -> bool:
            counts = (await http.get("/status")).json()["counts"]
            return counts.get("SENT", 0) == CREATES

        await eventually(all_sent, timeout=120, what=f"{CREATES} notifications SENT")
        for notification_id in ids:
            n = (await http.get(f"/notifications/{notification_id}")).json()
            assert (n["status"], n["attemptCount"]) == ("SENT", 1), n

        # A wake-up: the workers are idle now, and their next poll is 600 s away.
        created_at = time.monotonic()
        r = await http.post(
            "/notifications",
            json={"channel": "email", "recipient": "late@example.com", "body": "wake up"},
            headers={"Idempotency-Key": "pool-wake-up"},
        )
        assert r.status_code == 201, r.text
        late = r.json()["id"]

        async def late_sent() -> bool:
            return (await http.get(f"/notifications/{late}")).json()["status"] == "SENT"

        await eventually(late_sent, timeout=60, what="the notification woken by LISTEN is SENT")
        assert time.monotonic() - created_at < POLL_INTERVAL_SECONDS
    sampling = False
    await sampler

    # The pooler held the server side to its pool size, and the LISTEN connections went direct.
    pools = bouncer.show("POOLS")
    clients = bouncer.show("CLIENTS")
    assert len(pools) == 1 and pools[0]["pool_mode"] == "transaction"
    assert 0 < most_servers <= pool_size, (most_servers, pool_size)
    with psycopg.connect(direct, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name, client_addr FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    listening = [name for name, _ in rows if name.startswith("notify-queue-listen@")]
    assert len(listening) == 2, rows
    # Every other connection to the database is one of PgBouncer's server connections.
    assert len(rows) - len(listening) <= pool_size, rows
    print(
        f"pgbouncer: pool size {pool_size}, most server connections {most_servers}, "
        f"client connections at the end {len(clients)}; direct: {len(listening)} LISTEN"
    )
    for proc in [api, *workers]:
        assert proc.poll() is None, processes.log(proc)
    logs = processes.all_logs()
    assert "does not exist" not in logs, logs[-3000:]
