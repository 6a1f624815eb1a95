"""The drain's planning cost, statement by statement (issue 20, item 2; docs/performance.md, "The
drain's CPU, step by step", steps 7 and 8).

A fresh embedded PostgreSQL (pg_stat_statements with `track = all` and `track_planning`),
`notify-queue migrate`, and a backlog of N notifications enqueued by the API's own batch statement
(the NotificationService, batches of 500; no ANALYZE unless --analyse). Then one of three legs,
each run --rounds times, alternating its variants:

- statements (default): the claim's two statements and the completion (every row SENT) as the
  worker's repository sends them, on one connection per `plan_cache_mode` (--modes: auto,
  force_generic_plan, force_custom_plan, or local_generic: SET LOCAL force_generic_plan in each
  statement's transaction), the admission and the completion prepared at their first run. Around
  each statement the backend's own CPU time is read from /proc/<pid>/schedstat (on CPU,
  nanoseconds): what a statement costs PostgreSQL whatever else the machine runs.
- --repo-legs SRC,SRC: the repository code of each checkout (`<checkout>/src`, in a process of
  its own with PYTHONPATH=SRC) claims and completes batches of 100 on one pooled connection,
  with the same schedstat reading around each call (BEGIN, SET and COMMIT included).
- --workers K: K real `notify-queue worker` processes (default flags, no webhook target) drain a
  fresh backlog per variant; the variant is a `plan_cache_mode` for their connections
  (PGOPTIONS), optionally `@SRC` for another checkout's code. Reports the server's CPU per
  notification (every backend, reaped ones too) and pg_stat_statements' plans per call.

Since 0041 (the completion) and 0042 (the claim's steps) the drain's statements are functions that
plan under their own attributes (generic plans, `enable_seqscan = off`): a `plan_cache_mode` set on
the connection reaches the call, not the statements inside, so the statements leg's modes no longer
differ; the figures docs/performance.md quotes for them were measured before.

    .venv/bin/python -m benchmarks.probes.plancost --notifications 8000
    .venv/bin/python -m benchmarks.probes.plancost --repo-legs /work/main/src,src \
        --notifications 3500
    .venv/bin/python -m benchmarks.probes.plancost --workers 2 --notifications 5000 \
        --modes auto@/work/main/src,auto
    .venv/bin/python -m benchmarks.probes.plancost --finish-shapes --notifications 100000
    .venv/bin/python -m benchmarks.probes.plancost --claim-shapes --notifications 60000

`--finish-shapes`: the completion's cost per row beside what a final result cannot do without
(docs/performance.md, "The completion without its machinery"). The backlog is claimed (every row
PROCESSING under one token, then VACUUM (ANALYZE)), and batches of --batch rows go in turn to:
the completion as the worker sends it; `nq_finish_results` alone (the move with its counters and
events); a bare move (DELETE ... RETURNING into INSERT, nothing else); the DELETE alone; and an
UPDATE of the row to SENT in place (what a design that keeps finished rows in the queue's table
would pay at completion; its CHECK constraints dropped for that). Backend CPU per row, by
schedstat; medians over the batches.

`--claim-shapes`: the admission (the claim's second statement) per row beside a bare `UPDATE` of
the same rows with the same `RETURNING`, with and without a plain insert of each recipient's
window (docs/performance.md, "The admission and the give-back, only where they apply"). The
backlog is made as above and analysed; each claim locks --batch rows with the worker's step 1 and
hands them to the next shape in turn, in the same transaction. Backend CPU per row, by
schedstat, of the shape's statement alone; medians over the claims.

`--explain MODE` prints the plans auto_explain logs (ANALYZE, BUFFERS, nested statements) for two
claims and completions under that mode instead, rolled back; `--days-ahead D` creates the log's
partitions D days ahead first (more partitions).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import os
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from benchmarks import queue
from benchmarks.dbcost import postgres_cpu_seconds
from benchmarks.env import BenchPostgres, fresh_postgres
from notify_queue.models import Channel, NewNotification, Priority, Source
from notify_queue.repositories.db import Database, application_name
from notify_queue.repositories.notifications import NotificationRepository
from notify_queue.repositories.queries import QUERIES
from notify_queue.services.notifications import NotificationService

STATEMENTS = ("claim_lock_candidates", "claim_admit_candidates", "complete_deliveries")
SENT_ATTEMPT = '[{"provider": "log", "outcome": "sent", "ms": 1}]'


def cpu_ns(pid: int) -> int:
    """A process's time on CPU so far (schedstat's first field), in nanoseconds."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def ms(ns: float) -> str:
    return f"{ns / 1e6:.2f}"


async def ingest(
    url: str, n: int, *, subject: str | None = "Your receipt", body_chars: int = 120
) -> None:
    """`n` due notifications, each its own recipient, by the API's batch statement (500 a call)."""
    db = Database(url, pool_size=2, name="notify-queue-api")
    await db.open()
    try:
        service = NotificationService(NotificationRepository(db), default_max_attempts=6)
        now = datetime.now(UTC)
        for first in range(0, n, 500):
            items = []
            for _ in range(first, min(first + 500, n)):
                key = uuid.uuid4().hex
                items.append(
                    NewNotification(
                        idempotency_key=key,
                        request_hash=hashlib.sha256(key.encode()).hexdigest(),
                        channel=Channel.EMAIL,
                        recipient=f"{key}@example.com",
                        subject=subject,
                        body="x" * body_chars,
                        priority=Priority.NORMAL,
                        send_at=now,
                        source=Source.API,
                    )
                )
            await service.enqueue_many(items)
    finally:
        await db.close()


def backlog(pg: BenchPostgres, n: int) -> str:
    name = pg.database("plancost")
    url = pg.url(name)
    queue.migrate(url)
    asyncio.run(ingest(url, n))
    return name


def lock_params(batch: int) -> dict[str, Any]:
    return {
        "priorities": sorted(p.rank for p in Priority),
        "channels": [c.value for c in Channel],
        "limit": batch,
        # The worker's default (--aging-seconds).
        "aging_seconds": 600.0,
    }


def admit_params(ids: list[uuid.UUID]) -> dict[str, Any]:
    """Step 2's parameters (`claim` with the candidates; the lock step's go along, unused)."""
    return {
        **lock_params(len(ids)),
        "ids": ids,
        "claim_token": uuid.uuid4(),
        "rate_limit": 10,
        "rate_window_seconds": 3600.0,
        "lease_seconds": 300.0,
        "backoff_base_seconds": 0.5,
        "backoff_max_seconds": 60.0,
        "chain_channels": ["email"],
        "chain_heads": ["log"],
        "known_providers": ["log"],
        "quiet_ids": [],
        "webhook_url": None,
    }


def complete_params(rows: list[dict[str, Any]], token: uuid.UUID) -> dict[str, Any]:
    k = len(rows)
    return {
        "ids": [r["id"] for r in rows],
        "claim_tokens": [token] * k,
        "statuses": ["SENT"] * k,
        "retry_in_seconds": [None] * k,
        "last_errors": [None] * k,
        "provider_message_ids": [f"m-{r['id']}" for r in rows],
        "providers": ["log"] * k,
        "attempts": "[" + ",".join(SENT_ATTEMPT for _ in rows) + "]",
        "give_back": [False] * k,
        "next_attempt_ats": [None] * k,
        "addresses_gone": [False] * k,
        "bound_providers": [None] * k,
        "waiting_reasons": [None] * k,
        "waiting_details": [None] * k,
        "default_webhook_url": None,
    }


class Leg:
    """One connection in one plan-cache mode, used as a worker's connection is."""

    def __init__(self, url: str, mode: str, batch: int) -> None:
        self.mode = mode
        self.batch = batch
        self.conn = psycopg.connect(
            url,
            autocommit=True,
            row_factory=dict_row,
            application_name=application_name("notify-queue-worker"),
        )
        row = self.conn.execute("SELECT pg_backend_pid() AS pid").fetchone()
        assert row is not None
        self.pid = int(row["pid"])
        # local_generic: SET LOCAL force_generic_plan in each statement's transaction (the shape
        # tried and dropped at e54a0a6, and this branch's).
        self.local = mode == "local_generic"
        if not self.local:
            self.conn.execute(f"SET plan_cache_mode = {mode}")
        self.cpu: dict[str, list[int]] = {s: [] for s in STATEMENTS}

    def _generic(self) -> None:
        if self.local:
            self.conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")

    def one(self) -> int:
        """One claim and its completion; the rows claimed."""
        c = self.conn
        with c.transaction():
            self._generic()
            t0 = cpu_ns(self.pid)
            locked = c.execute(
                QUERIES["claim_lock_candidates"], lock_params(self.batch), prepare=self.local
            ).fetchone()
            t1 = cpu_ns(self.pid)
            if locked is None or not locked["ids"]:
                return 0
            params = admit_params(locked["ids"])
            rows = c.execute(QUERIES["claim"], params, prepare=True).fetchall()
            t2 = cpu_ns(self.pid)
        rows = [r for r in rows if r["id"] is not None]
        with c.transaction():
            self._generic()
            t3 = cpu_ns(self.pid)
            done = complete_params(rows, params["claim_token"])
            c.execute(QUERIES["complete_deliveries"], done, prepare=True).fetchone()
            t4 = cpu_ns(self.pid)
        self.cpu["claim_lock_candidates"].append(t1 - t0)
        self.cpu["claim_admit_candidates"].append(t2 - t1)
        self.cpu["complete_deliveries"].append(t4 - t3)
        return len(rows)

    def explain(self) -> None:
        c = self.conn
        c.execute("LOAD 'auto_explain'")
        for name in ("log_analyze", "log_buffers", "log_nested_statements", "log_timing"):
            c.execute(f"SET auto_explain.{name} = on")
        c.execute("SET auto_explain.log_min_duration = 0")
        c.execute("SET client_min_messages = log")
        c.add_notice_handler(lambda d: print(d.message_primary, file=sys.stderr))
        for _ in range(2):  # the second: what a prepared statement does from then on
            with c.transaction(force_rollback=True):
                self._generic()
                locked = c.execute(
                    QUERIES["claim_lock_candidates"], lock_params(self.batch), prepare=self.local
                ).fetchone()
                assert locked is not None
                params = admit_params(locked["ids"])
                rows = c.execute(QUERIES["claim"], params, prepare=True).fetchall()
                rows = [r for r in rows if r["id"] is not None]
                done = complete_params(rows, params["claim_token"])
                c.execute(QUERIES["complete_deliveries"], done, prepare=True).fetchone()


_LOG_COLUMNS = (
    "id, idempotency_key, request_hash, channel, recipient, subject, body, priority, status,"
    " send_at, next_attempt_at, expires_at, attempt_count, max_attempts, last_error, sent_at,"
    " provider_message_id, retries, source, policy, webhook_url, metadata, created_at,"
    " updated_at, finished_at, recipient_id, category, template_name, template_version,"
    " provider, delivery_attempts, bucket, digest_id, escalation_id, traceparent"
)
FINISH_SHAPES = {
    "completion (complete_deliveries)": QUERIES["complete_deliveries"],
    "nq_finish_results alone": (
        "SELECT count(*) FROM nq_finish_results(%(ids)b::uuid[], %(claim_tokens)b::uuid[],"
        " %(statuses)b::text[], %(last_errors)b::text[], %(give_back)b::bool[],"
        " %(provider_message_ids)b::text[], %(providers)b::text[], %(bound_providers)b::text[],"
        " %(attempts)s::jsonb, %(default_webhook_url)s)"
    ),
    "bare move (DELETE into INSERT)": (
        "WITH moved AS (DELETE FROM nq_jobs j WHERE j.id = ANY(%(ids)b::uuid[])"
        " AND j.claim_token = %(token)s RETURNING j.*)"
        f" INSERT INTO nq_delivery_log ({_LOG_COLUMNS})"
        " SELECT id, idempotency_key, request_hash, channel, recipient, subject, body, priority,"
        " 'SENT', send_at, next_attempt_at, expires_at, attempt_count, max_attempts, NULL,"
        " now(), 'm', retries, source, policy, webhook_url, metadata, created_at, now(), now(),"
        " recipient_id, category, template_name, template_version, 'log', delivery_attempts,"
        " bucket, digest_id, escalation_id, traceparent FROM moved"
    ),
    "DELETE alone": (
        "DELETE FROM nq_jobs WHERE id = ANY(%(ids)b::uuid[]) AND claim_token = %(token)s"
    ),
    "UPDATE to SENT in place": (
        "UPDATE nq_jobs SET status = 'SENT', sent_at = now(), finished_at = now(),"
        " provider_message_id = 'm', provider = 'log', claim_token = NULL,"
        " lease_expires_at = NULL, updated_at = now()"
        " WHERE id = ANY(%(ids)b::uuid[]) AND claim_token = %(token)s"
    ),
}


_CLAIMED_COLUMNS = (
    "n.id, n.bucket, n.channel, n.recipient, n.subject, n.body, n.metadata, n.attempt_count,"
    " n.max_attempts, n.priority, n.policy, n.next_attempt_at, n.created_at, n.category,"
    " n.expires_at, n.recipient_id, n.source, n.provider AS bound_provider, n.send_at,"
    " n.traceparent, n.digest_id"
)
_BARE_ADMISSION = (
    "UPDATE nq_jobs n SET status = 'PROCESSING', attempt_count = n.attempt_count + 1,"
    " claim_token = %(claim_token)s,"
    " lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),"
    " provider = COALESCE(n.provider, 'log'), waiting_reason = NULL, waiting_until = NULL,"
    " waiting_detail = NULL, updated_at = now()"
    f" WHERE n.id = ANY(%(ids)b::uuid[]) RETURNING {_CLAIMED_COLUMNS}"
)
CLAIM_SHAPES = {
    "admission (claim_admit_candidates)": QUERIES["claim"],
    "bare update and window inserts": (
        f"WITH admitted AS ({_BARE_ADMISSION}), opened AS ("
        " INSERT INTO nq_rate_windows (bucket, recipient, ids, taken, last_taken_at)"
        " SELECT a.bucket, a.recipient, array_agg(a.id), array_agg(now()), now()"
        " FROM admitted a GROUP BY a.bucket, a.recipient)"
        " SELECT * FROM admitted"
    ),
    "bare update (no rate limit)": _BARE_ADMISSION,
}


def claim_shapes(pg: BenchPostgres, args: argparse.Namespace) -> None:
    """The admission beside what admitting a batch cannot do without; see the docstring."""
    name = backlog(pg, args.notifications)
    with psycopg.connect(pg.url(name), autocommit=True, row_factory=dict_row) as c:
        c.execute("VACUUM (ANALYZE)")
        found = c.execute("SELECT pg_backend_pid() AS pid").fetchone()
        assert found is not None
        pid = int(found["pid"])
        c.execute("SET plan_cache_mode = force_generic_plan")
        c.execute("SET enable_seqscan = off")
        per_row: dict[str, list[float]] = {shape: [] for shape in CLAIM_SHAPES}
        shapes = list(CLAIM_SHAPES)
        for i in itertools.count():
            shape = shapes[i % len(shapes)]
            with c.transaction():
                locked = c.execute(
                    QUERIES["claim_lock_candidates"], lock_params(args.batch), prepare=True
                ).fetchone()
                if locked is None or not locked["ids"]:
                    break
                t0 = cpu_ns(pid)
                c.execute(CLAIM_SHAPES[shape], admit_params(locked["ids"]), prepare=True)
                per_row[shape].append((cpu_ns(pid) - t0) / len(locked["ids"]))
    print(f"backend CPU per row, claims of {args.batch} (median of {len(per_row[shapes[0]])}):")
    for shape, v in per_row.items():
        print(f"  {shape:34} {statistics.median(v[1:]) / 1e3:6.1f} us")
    pg.drop(name)


def finish_shapes(pg: BenchPostgres, args: argparse.Namespace) -> None:
    name = backlog(pg, args.notifications)
    token = uuid.uuid4()
    with psycopg.connect(pg.url(name), autocommit=True, row_factory=dict_row) as c:
        c.execute(
            "UPDATE nq_jobs SET status = 'PROCESSING', claim_token = %s, attempt_count = 1,"
            " lease_expires_at = now() + interval '1 hour'",
            (token,),
        )
        # Only the in-place shape needs these gone (a SENT row in the queue's table).
        c.execute("ALTER TABLE nq_jobs DROP CONSTRAINT nq_jobs_unfinished")
        c.execute("VACUUM (ANALYZE)")
        c.execute("SELECT nq_delivery_log_ready()")
        rows = c.execute("SELECT id FROM nq_jobs ORDER BY random()").fetchall()
        found = c.execute("SELECT pg_backend_pid() AS pid").fetchone()
        assert found is not None
        pid = int(found["pid"])
        per_row: dict[str, list[float]] = {shape: [] for shape in FINISH_SHAPES}
        shapes = list(FINISH_SHAPES)
        for i, first in enumerate(range(0, len(rows), args.batch)):
            part = rows[first : first + args.batch]
            shape = shapes[i % len(shapes)]
            params = complete_params(part, token) | {"token": token}
            t0 = cpu_ns(pid)
            c.execute(FINISH_SHAPES[shape], params, prepare=True)
            per_row[shape].append((cpu_ns(pid) - t0) / len(part))
    print(f"backend CPU per row, batches of {args.batch} (median of {len(per_row[shapes[0]])}):")
    for shape, v in per_row.items():
        print(f"  {shape:34} {statistics.median(v[1:]) / 1e3:6.1f} us")
    pg.drop(name)


def quarters(v: list[int]) -> list[list[int]]:
    k = max(1, len(v) // 4)
    return [v[i : i + k] for i in range(0, len(v), k)][:4]


def statements(url: str, limit: int = 8) -> list[dict[str, Any]]:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as c:
        return c.execute(
            "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 50) AS q, calls, plans,"
            " round((total_plan_time / greatest(plans, 1))::numeric, 2) AS plan_ms,"
            " round((total_exec_time / calls)::numeric, 2) AS exec_ms"
            " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database"
            " WHERE datname = current_database()) AND calls > 5"
            " AND query NOT IN ('BEGIN', 'COMMIT') ORDER BY total_exec_time DESC LIMIT %s",
            (limit,),
        ).fetchall()


def print_statements(url: str) -> None:
    for r in statements(url):
        print(
            f"    {r['q']:52} calls {r['calls']:4} plans {r['plans']:4}"
            f"  plan {r['plan_ms']:7} ms  exec {r['exec_ms']:7} ms"
        )


def statement_legs(pg: BenchPostgres, args: argparse.Namespace) -> None:
    name = backlog(pg, args.notifications)
    url = pg.url(name)
    with psycopg.connect(url, autocommit=True) as c:
        if args.days_ahead:
            c.execute("SELECT nq_delivery_log_prepare(%s)", (args.days_ahead,))
        if args.analyse:
            c.execute("VACUUM (ANALYZE)")
        parts = c.execute(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'nq_delivery_log'::regclass"
        ).fetchone()
        print(f"log partitions: {parts[0] if parts else '?'}")
        c.execute("SELECT pg_stat_statements_reset()")
    modes = args.modes.split(",")
    legs = [Leg(url, m, args.batch) for m in modes]
    if args.explain:
        next(leg for leg in legs if leg.mode == args.explain).explain()
        return
    per_round = max(1, args.notifications // args.batch // len(modes) // args.rounds)
    for _ in range(args.rounds):
        for leg in legs:
            for _ in range(per_round):
                leg.one()
    print("backend CPU per call (schedstat), the first call apart (it parses and plans):")
    for leg in legs:
        for s in STATEMENTS:
            v = leg.cpu[s][1:]
            if not v:
                continue
            print(
                f"  {leg.mode:19} {s:23} calls {len(v):3}  median {ms(statistics.median(v))}"
                f"  mean {ms(statistics.mean(v))}  first {ms(leg.cpu[s][0])} ms;  by quarter "
                + " ".join(ms(statistics.mean(q)) for q in quarters(v))
            )
    print_statements(url)
    for leg in legs:
        leg.conn.close()


async def repo_leg(url: str, calls: int) -> None:
    """Run in a process whose notify_queue is the checkout measured (PYTHONPATH)."""
    from notify_queue.models import Completion, Status
    from notify_queue.repositories.delivery import (
        ChainHeads,
        DeliveryDefaults,
        DeliveryRepository,
    )

    db = Database(url, pool_size=1, name="notify-queue-worker")
    await db.open()  # the pool's one connection, found by its name
    with psycopg.connect(url, autocommit=True) as c:
        found = c.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = %s",
            (application_name("notify-queue-worker"),),
        ).fetchall()
    assert len(found) == 1, found
    pid = int(found[0][0])
    repo = DeliveryRepository(db, DeliveryDefaults(10, 3600.0, 0.5, 60.0, 300.0, None))
    heads = ChainHeads({Channel.EMAIL: "log"}, ("log",))
    claim: list[int] = []
    complete: list[int] = []
    for _ in range(calls):
        t0 = cpu_ns(pid)
        batch = await repo.notifications_claim(
            priorities=list(Priority), channels=list(Channel), limit=100, chain_heads=heads
        )
        t1 = cpu_ns(pid)
        if not batch.claimed:
            break
        done = [
            Completion(
                c.id, c.claim_token, Status.SENT, None, None, f"m-{c.id}", "log", SENT_ATTEMPT
            )
            for c in batch.claimed
        ]
        t2 = cpu_ns(pid)
        await repo.deliveries_complete(completions=done)
        t3 = cpu_ns(pid)
        claim.append(t1 - t0)
        complete.append(t3 - t2)
    await db.close()
    for label, v in (("claim", claim), ("completion", complete)):
        print(
            f"  {label:10} calls {len(v) - 1} after the first:"
            f" median {ms(statistics.median(v[1:]))}"
            f"  mean {ms(statistics.mean(v[1:]))} ms; first {ms(v[0])} ms"
        )


def repo_legs(pg: BenchPostgres, args: argparse.Namespace) -> None:
    for _ in range(args.rounds):
        for src in args.repo_legs.split(","):
            name = backlog(pg, args.notifications)
            print(src, flush=True)
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.probes.plancost",
                    "--repo-leg-url",
                    pg.url(name),
                ],
                env=dict(os.environ, PYTHONPATH=str(Path(src).resolve())),
                check=True,
            )
            pg.drop(name)


def worker_legs(pg: BenchPostgres, args: argparse.Namespace, logdir: Path) -> None:
    for _ in range(args.rounds):
        for variant in args.modes.split(","):
            mode, _, src = variant.partition("@")
            name = backlog(pg, args.notifications)
            url = pg.url(name)
            with psycopg.connect(url, autocommit=True) as c:
                c.execute("SELECT pg_stat_statements_reset()")
            env = dict(os.environ, PGOPTIONS=f"-c plan_cache_mode={mode}")
            if src:
                env["PYTHONPATH"] = str(Path(src).resolve())
            pid = pg.server.pid
            assert pid is not None
            cpu0 = postgres_cpu_seconds(pid)
            t0 = time.monotonic()
            command = [sys.executable, "-m", "notify_queue", "worker", "--database-url", url]
            procs = []
            for i in range(args.workers):
                with open(logdir / f"worker-{i}.log", "w") as log:
                    procs.append(
                        subprocess.Popen(
                            [*command, "--log-level", "WARNING"],
                            env=env,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                        )
                    )
            try:
                with psycopg.connect(url, autocommit=True) as c:
                    while queue.any_unfinished(c):
                        time.sleep(0.2)
                seconds = time.monotonic() - t0
            finally:
                for p in procs:
                    p.terminate()
                for p in procs:
                    p.wait()
            time.sleep(1.0)  # the backends' exits, reaped by the postmaster
            cpu = postgres_cpu_seconds(pid) - cpu0
            print(
                f"{variant}: {args.workers} workers drained {args.notifications}"
                f" in {seconds:.1f} s;"
                f" PostgreSQL CPU {cpu * 1e6 / args.notifications:.0f} us per notification"
            )
            print_statements(url)
            pg.drop(name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--notifications", type=int, default=6000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--modes", default="auto,force_generic_plan,force_custom_plan")
    ap.add_argument("--rounds", type=int, default=4, help="alternations of the variants")
    ap.add_argument("--analyse", action="store_true", help="VACUUM (ANALYZE) before the legs")
    ap.add_argument("--days-ahead", type=int, default=0, help="log partitions this far ahead")
    ap.add_argument("--explain", default=None, metavar="MODE")
    ap.add_argument("--repo-legs", default="", metavar="SRC,SRC")
    ap.add_argument("--repo-leg-url", default="", help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--finish-shapes", action="store_true")
    ap.add_argument("--claim-shapes", action="store_true")
    args = ap.parse_args()
    if args.repo_leg_url:
        asyncio.run(repo_leg(args.repo_leg_url, 1000))
        return
    with fresh_postgres("plancost") as pg:
        with psycopg.connect(pg.url(), autocommit=True) as c:
            c.execute("ALTER SYSTEM SET pg_stat_statements.track_planning = on")
            c.execute("ALTER SYSTEM SET pg_stat_statements.track = 'all'")
            c.execute("SELECT pg_reload_conf()")
        if args.finish_shapes:
            finish_shapes(pg, args)
        elif args.claim_shapes:
            claim_shapes(pg, args)
        elif args.repo_legs:
            repo_legs(pg, args)
        elif args.workers:
            worker_legs(pg, args, pg.workdir)
        else:
            statement_legs(pg, args)


if __name__ == "__main__":
    main()
