"""`notify-queue migrate` on a Citus coordinator lays the schema out distributed (CONTRACT section
11, docs/scaling.md "Citus: the layout"), and the claim routes bucket by bucket there.

Real parts: the cluster of tests/citus/cluster.py, `notify-queue migrate` and `notify-queue api`
as processes, the worker's repository against the coordinator."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psycopg
import pytest

from notify_queue.models import Channel, Completion, Priority, Status
from notify_queue.repositories import schema
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery import DeliveryRepository
from notify_queue.repositories.delivery_log import DeliveryLogRepository
from notify_queue.repositories.notifications import NotificationRepository
from tests.citus.cluster import CitusCluster
from tests.citus.test_cluster import rows_per_worker
from tests.support import defaults, expand_steps_after, running_api

pytestmark = pytest.mark.citus

DISTRIBUTED = {
    "nq_jobs": "bucket",
    "nq_delivery_log": "bucket",
    "nq_rate_windows": "bucket",
    "nq_webhook_events": "bucket",
    "nq_digests": "bucket",
    "nq_idempotency_keys": "key",
    "nq_counters": "shard",
}
REFERENCE = {
    "nq_policies",
    "nq_templates",
    "nq_recipients",
    "nq_recipient_voices",
    "nq_recipient_destinations",
    "nq_suppressions",
    "nq_delivery_receipts",
}
# Written on every delivery, joined with no distributed table: plain tables on the coordinator.
COORDINATOR_ONLY = {"nq_provider_schedule", "nq_provider_circuits", "nq_provider_resolvers"}
# The operator's: written with every change of an object's row and locked by the operator, joined
# with no distributed table in a locking statement: plain tables on the coordinator.
OPERATOR_ON_COORDINATOR = {"nq_kube_links", "nq_status_outbox"}
CO_LOCATED = [
    "nq_jobs",
    "nq_delivery_log",
    "nq_rate_windows",
    "nq_webhook_events",
    "nq_digests",
    # So a function delegated by bucket counts on its own node (citus/functions.sql).
    "nq_counters",
]
# The drain's per-bucket steps, delegated to the node holding the bucket (citus/functions.sql).
DELEGATED = {
    "nq_finish_bucket",
    "nq_complete_bucket",
    "nq_claim_lock_bucket",
    "nq_claim_lock_bucket_v2",
    "nq_claim_admit_bucket",
    "nq_claim_admit_bucket_v2",
    "nq_recover_expired_leases_bucket",
}


def migrate(url: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "notify_queue", "migrate", "--database-url", url],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def layout(url: str) -> dict[str, tuple[str, str | None, int]]:
    """Table -> (method, distribution column, co-location group), partitions of the log aside."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            """
            SELECT logicalrelid::text, partmethod,
                   column_to_column_name(logicalrelid, partkey), colocationid
            FROM pg_dist_partition
            WHERE logicalrelid::text NOT LIKE 'nq\\_delivery\\_log\\_%'
            """
        ).fetchall()
    return {t: (m, c, g) for t, m, c, g in rows}


def delegated(url: str) -> dict[str, tuple[int | None, int | None, bool | None]]:
    """Distributed function -> (distribution argument index, co-location group, forced)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            """
            SELECT p.proname, o.distribution_argument_index, o.colocationid, o.force_delegation
            FROM pg_dist_object o JOIN pg_proc p ON p.oid = o.objid
            WHERE o.classid = 'pg_proc'::regclass AND p.proname ~ '^nq_.*_bucket(_v[0-9]+)?$'
            """
        ).fetchall()
    return {name: (index, group, forced) for name, index, group, forced in rows}


def test_migrate_twice_distributes_the_schema_once(citus_database: str) -> None:
    migrate(citus_database)
    first = layout(citus_database)
    functions = delegated(citus_database)
    assert "0 migrations applied" in migrate(citus_database)
    assert layout(citus_database) == first
    assert delegated(citus_database) == functions
    # Each by its first argument (p_bucket), with the queue's shards, forced into the caller's
    # transaction.
    assert functions == {name: (0, first["nq_jobs"][2], True) for name in DELEGATED}

    for table, column in DISTRIBUTED.items():
        assert first[table][:2] == ("h", column), table
    assert {t for t, (m, _, _) in first.items() if m == "n"} == REFERENCE
    assert not COORDINATOR_ONLY & set(first)
    assert not OPERATOR_ON_COORDINATOR & first.keys()
    assert len({first[t][2] for t in CO_LOCATED}) == 1
    with psycopg.connect(citus_database) as conn:
        keys = conn.execute(
            """
            SELECT conrelid::regclass::text, array_agg(a.attname ORDER BY k.n)
            FROM pg_constraint c, unnest(c.conkey) WITH ORDINALITY AS k(attnum, n)
            JOIN pg_attribute a ON a.attnum = k.attnum
            WHERE c.contype = 'p' AND a.attrelid = c.conrelid
              AND c.conrelid IN ('nq_jobs'::regclass, 'nq_webhook_events'::regclass)
            GROUP BY 1
            """
        ).fetchall()
        shards = conn.execute(
            "SELECT count(DISTINCT shardid) FROM pg_dist_shard"
            " WHERE logicalrelid = 'nq_jobs'::regclass"
        ).fetchone()
    assert dict(keys) == {"nq_jobs": ["bucket", "id"], "nq_webhook_events": ["bucket", "id"]}
    assert shards == (16,)


async def test_creates_spread_over_both_workers_and_claims_route_per_bucket(
    citus_cluster: CitusCluster, citus_database: str, tmp_path: Path
) -> None:
    migrate(citus_database)
    headers = {"Authorization": "Bearer t"}
    async with running_api(citus_database, tmp_path / "api.log", "--api-token", "t") as base:
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as http:
            for i in range(20):
                response = await http.post(
                    "/notifications",
                    json={
                        "channel": "email",
                        "recipient": f"user-{i}@example.com",
                        "body": "hello",
                        "idempotencyKey": f"single-{i}",
                        "priority": "HIGH" if i % 5 == 0 else "NORMAL",
                    },
                )
                assert response.status_code == 201, response.text
            batch = await http.post(
                "/notifications/batch",
                json={
                    "notifications": [
                        {
                            "channel": "email",
                            "recipient": f"batch-{i}@example.com",
                            "body": "hello",
                            "idempotencyKey": f"batch-{i}",
                        }
                        for i in range(20)
                    ]
                },
            )
            assert batch.status_code in (200, 201, 207), batch.text
            assert [r["status"] for r in batch.json()["results"]] == [201] * 20
            status = (await http.get("/status")).json()
    assert status["database"] == {"engine": "citus", "workerNodes": 2}
    per_worker = rows_per_worker(citus_cluster, citus_database, "nq_jobs")
    assert sorted(per_worker) == sorted(w.port for w in citus_cluster.workers)
    assert sum(per_worker.values()) == 40

    async with Database(citus_database, pool_size=2) as db:
        repository = DeliveryRepository(db, defaults())
        first = await repository.notifications_claim(
            priorities=list(Priority), channels=list(Channel), limit=4
        )
        # The four HIGH rows are the most urgent anywhere: the claim visits their buckets first.
        assert [c.priority for c in first.claimed] == [Priority.HIGH] * 4
        claimed = list(first.claimed)
        while True:
            more = await repository.notifications_claim(
                priorities=list(Priority), channels=list(Channel), limit=7
            )
            if not more.claimed:
                break
            claimed += more.claimed
    assert len(claimed) == len({c.id for c in claimed}) == 40
    with psycopg.connect(citus_database) as conn:
        assert conn.execute("SELECT status, count(*) FROM nq_jobs GROUP BY 1").fetchall() == [
            ("PROCESSING", 40)
        ]
        # The completion is delegated whole to the node holding the bucket: one task there,
        # the function run on it, nothing planned in parts on the coordinator.
        bucket, port = conn.execute(
            """
            SELECT j.bucket, n.nodeport FROM nq_jobs j
            JOIN pg_dist_placement p
              ON p.shardid = get_shard_id_for_distribution_column('nq_jobs', j.bucket)
            JOIN pg_dist_node n ON n.groupid = p.groupid
            LIMIT 1
            """
        ).fetchone()
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN (COSTS OFF) SELECT * FROM nq_complete_bucket(%s::smallint, '{}', '{}',"
                " '{}', '{}', '{}', '{}', '{}', '[]', '{}', '{}', '{}', '{}', '{}', '{}', NULL)",
                [bucket],
            )
        )
    assert "Task Count: 1" in plan and f"port={port}" in plan, plan
    assert "Subplan" not in plan, plan

    # Every claimed row completes through the delegated function: moved, counted, once.
    async with Database(citus_database, pool_size=2) as db:
        repository = DeliveryRepository(db, defaults())
        recorded = await repository.deliveries_complete(
            completions=[
                Completion(c.id, c.claim_token, Status.SENT, None, None, f"m-{c.id}", "smtp")
                for c in claimed
            ]
        )
    assert recorded.accepted == {c.id for c in claimed}
    with psycopg.connect(citus_database) as conn:
        assert conn.execute("SELECT count(*) FROM nq_jobs").fetchone() == (0,)
        assert conn.execute(
            "SELECT status, count(*) FROM nq_delivery_log GROUP BY 1"
        ).fetchall() == [("SENT", 40)]
        assert conn.execute(
            "SELECT sum(n) FROM nq_counters WHERE name = 'notifications:SENT'"
        ).fetchone() == (40,)


async def test_a_claim_takes_every_urgent_row_and_fills_up_from_few_buckets(
    citus_database: str, tmp_path: Path
) -> None:
    """Strict priority, concentrated fairness (docs/scaling.md "Citus: the claim"): HIGH rows
    in 8 buckets, a NORMAL backlog alternating over 2 other buckets. A claim of 20 takes all 8
    HIGH rows, then its 12 NORMAL rows from the bucket of the oldest NORMAL row alone; the next
    claim starts from the other bucket, whose oldest row is then the oldest."""
    migrate(citus_database)
    with psycopg.connect(citus_database) as conn:
        candidates = [f"r-{i}@example.com" for i in range(2000)]
        bucket_of = dict(
            conn.execute(
                "SELECT r, nq_bucket(r) FROM unnest(%s::text[]) r", [candidates]
            ).fetchall()
        )
    by_bucket: dict[int, list[str]] = {}
    for recipient, bucket in bucket_of.items():
        by_bucket.setdefault(bucket, []).append(recipient)
    full = sorted(b for b, rs in by_bucket.items() if len(rs) >= 18)
    a, b, high_buckets = full[0], full[1], full[2:10]
    assert len(high_buckets) == 8
    # NORMAL rows alternate between buckets a and b, oldest first; the HIGH rows are the newest.
    # Bucket a has 6 more, newer than all of b's.
    normal = [r for pair in zip(by_bucket[a][:12], by_bucket[b][:12], strict=True) for r in pair]
    normal += by_bucket[a][12:18]
    high = [by_bucket[x][0] for x in high_buckets]
    headers = {"Authorization": "Bearer t"}
    async with running_api(citus_database, tmp_path / "api.log", "--api-token", "t") as base:
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as http:
            batch = await http.post(
                "/notifications/batch",
                json={
                    "notifications": [
                        {
                            "channel": "email",
                            "recipient": r,
                            "body": "hello",
                            "idempotencyKey": f"k-{r}",
                            "priority": "NORMAL" if r in normal else "HIGH",
                        }
                        for r in normal + high
                    ]
                },
            )
            assert [r["status"] for r in batch.json()["results"]] == [201] * 38, batch.text
    with psycopg.connect(citus_database, autocommit=True) as conn:
        # Due times one second apart in that order (one batch shares its transaction's now()).
        for i, r in enumerate(normal + high):
            conn.execute(
                "UPDATE nq_jobs SET next_attempt_at = %s::timestamptz - %s * interval '1 second'"
                " WHERE bucket = %s AND recipient = %s",
                [datetime.now(UTC), 100 - i, bucket_of[r], r],
            )

    async with Database(citus_database, pool_size=2) as db:
        repository = DeliveryRepository(db, defaults())
        first = await repository.notifications_claim(
            priorities=list(Priority), channels=list(Channel), limit=20
        )
        claimed = first.claimed
        assert sorted(c.recipient for c in claimed if c.priority is Priority.HIGH) == sorted(high)
        normal_buckets = Counter(
            bucket_of[c.recipient] for c in claimed if c.priority is Priority.NORMAL
        )
        # Per-look sizes would have taken 6 from each; the oldest NORMAL row's bucket gives all 12.
        assert normal_buckets == {a: 12}
        # No bucket starves: the next claim starts from bucket b, whose oldest row is now oldest
        # (a still has 6, newer).
        second = await repository.notifications_claim(
            priorities=list(Priority), channels=list(Channel), limit=12
        )
        assert Counter(bucket_of[c.recipient] for c in second.claimed) == {b: 12}


async def test_the_steps_after_0_2_0_apply_to_an_installation_distributed_at_0_2_0(
    citus_database: str,
) -> None:
    """An installation laid out on Citus at 0.2.0's schema (its steps squashed: 0009-0022,
    docs/upgrading.md), with history in the log: this release's `migrate` applies the later
    steps to the distributed tables and lays out what they add; the drain's reads go on."""
    async with Database(citus_database, pool_size=2) as db:
        await schema.migrate(db, target=22)
        async with db.connection() as conn:
            # This release's drain runs below: its functions, as every full `migrate` defines
            # them after the migrations (a migration up to a target leaves them out), but those
            # of the receipts' tables (0075, 0076): a SQL body naming a table that does not exist
            # yet is refused where Citus makes it on the worker nodes. The full `migrate` below
            # defines them.
            later = ("nq_delivery_receipts", "nq_suppressions")
            sources = schema.function_sources().values()
            async with conn.transaction():
                await conn.execute("migration_function_bodies_unchecked")
                await conn.execute_script(
                    "\n".join(s for s in sources if not any(t in s for t in later))
                )
            await schema._lay_out(conn)
        # History as 0.2.0 left it: final rows in the log, written directly.
        ids = [uuid.uuid4() for _ in range(12)]
        failed = set(ids[:3])
        with psycopg.connect(citus_database) as conn:
            for i, id in enumerate(ids):
                conn.execute(
                    "INSERT INTO nq_delivery_log (id, idempotency_key, request_hash, channel,"
                    " recipient, body, priority, status, send_at, next_attempt_at, max_attempts,"
                    " finished_at, bucket) VALUES (%s, %s, '', 'email', %s, 'b', 1, %s, now(),"
                    " now(), 1, now(), nq_bucket(%s))",
                    (
                        id,
                        f"k{i}",
                        f"r{i}@example.com",
                        "FAILED" if id in failed else "SENT",
                        f"r{i}@example.com",
                    ),
                )
        assert await schema.migrate(db) == expand_steps_after(22)
        # The log's parts of 0075's index on the partition with rows: the workers' housekeeping.
        assert len(await DeliveryLogRepository(db).partitions_index()) == 1
        assert await schema.migrate(db, contract=True) == []
        listed = await NotificationRepository(db).notifications_list(
            status=Status.FAILED, channel=None, recipient=None, after=None, limit=50
        )
        assert {n.id for n in listed} == failed
        everything = await NotificationRepository(db).notifications_list(
            status=None, channel=None, recipient=None, after=None, limit=50
        )
        assert {n.id for n in everything} == set(ids)
    distributed = layout(citus_database)
    assert {t: distributed[t][1] for t in DISTRIBUTED} == DISTRIBUTED
    with psycopg.connect(citus_database) as conn:
        # Both of the log's indexes built ON ONLY it are whole: 0009's and 0075's.
        assert conn.execute(
            "SELECT array_agg(indisvalid) FROM pg_index WHERE indexrelid IN"
            " ('nq_delivery_log_unsent'::regclass,"
            " 'nq_delivery_log_provider_message'::regclass)"
        ).fetchone() == ([True, True],)
        gone = (
            "SELECT to_regclass('nq_jobs_created'), to_regclass('nq_delivery_log_status_created')"
        )
        assert conn.execute(gone).fetchone() == (None, None)
