"""`migrate` over a real backlog holds no create back: the steps that index the queue build
CONCURRENTLY (docs/upgrading.md, "Index builds on the queue").

0.1.0 (built from this repository's history) migrates an empty database and the step 0009
follows; a backlog of a million pending notifications is then written into the queue with SQL, and
0.1.0's API serves creates from clients that never stop, its connections with `lock_timeout = 2s`
(PGOPTIONS): a create that waited longer than that for a lock on the queue is refused (an error
answer, counted as a failed create). This release's `migrate` then runs the remaining steps, the
queue's three index builds among them (0010). From 0.1.0 because its upgrade is the one that
builds them (a database of 0.2.0 has them already); the backlog arrives after 0009, whose bucket
backfill of the queue's rows runs under its rename's lock (docs/upgrading.md, "0.1.0 to 0.2.0").
`python -m benchmarks.probes.upgradelock` measures how long creates stalled.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import psycopg
import pytest

from notify_queue.repositories.db import Database
from notify_queue.repositories.schema import migrate
from tests.support import free_port
from tests.upgrade.baseline import BASELINES, baseline_venv
from tests.upgrade.support import CreateLoad, Release, wait_ready

pytestmark = pytest.mark.upgrade

BACKLOG = 1_000_000
FROM = BASELINES[0]  # 0.1.0
QUEUE_INDEXES = ("nq_jobs_waiting", "nq_jobs_digest", "nq_jobs_pending_created")
BEFORE_THE_BUILDS = 9

# The queue, pending and due in a day: the backlog a busy installation has
# while its workers are behind. One statement, so the seed takes seconds, not minutes.
SEED = """
INSERT INTO nq_jobs (id, idempotency_key, request_hash, channel, recipient, subject, body,
                      priority, status, send_at, next_attempt_at, max_attempts, bucket)
SELECT gen_random_uuid(), 'backlog-' || g, 'seed', 'email', r, 'backlog',
       'queued before the upgrade', (g %% 3)::smallint, 'PENDING', now() + interval '1 day',
       now() + interval '1 day', 5, nq_bucket(r)
FROM generate_series(1, %s) AS g, LATERAL (SELECT 'r' || (g %% 5000) || '@example.com') AS x(r)
"""


async def test_migrate_over_a_million_row_backlog_refuses_no_create(
    empty_database_url: str, tmp_path: Path
) -> None:
    url = empty_database_url
    old = Release(FROM.release, baseline_venv(FROM) / "bin" / "python", url, tmp_path)
    new = Release("new", sys.executable, url, tmp_path)
    old_url = f"http://127.0.0.1:{free_port()}"
    load = CreateLoad(target=old_url)
    try:
        installed = old.run("migrate")
        assert installed.returncode == 0, installed.stderr
        async with Database(url, pool_size=1) as db:
            await migrate(db, target=BEFORE_THE_BUILDS)
        with psycopg.connect(url, autocommit=True) as conn:
            # No trigger for the seed (the rows carry their bucket): the backlog is the point,
            # not how 0.1.0 counted it.
            conn.execute("SET session_replication_role = replica")
            conn.execute(SEED, (BACKLOG,))
            conn.execute("ANALYZE nq_jobs")
        api = old.start(
            "api",
            "--port",
            old_url.rsplit(":", 1)[1],
            env={"PGOPTIONS": "-c lock_timeout=2s"},
        )
        await wait_ready(old_url, api, old)
        load.start()
        await load.until("before", 20)

        load.phase = "migrate"
        migrated = await asyncio.to_thread(new.run, "migrate")
        load.phase = "after"
        await load.until("after", 20)
        await load.stop()
    finally:
        if not load._stop.is_set() and load._tasks:
            await load.stop()
        old.kill_all()

    assert migrated.returncode == 0, migrated.stderr
    print(
        f"backlog {BACKLOG}: {dict(load.created_by_phase)} created, {len(load.failures)} failed, "
        f"longest create {load.longest_create_seconds}"
    )
    assert load.failures == [], load.failures[:5]
    assert load.created_by_phase["migrate"] > 0  # creates went on while migrate ran
    with psycopg.connect(url, autocommit=True) as conn:
        indexes = conn.execute(
            "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE c.relname = ANY(%s)",
            (list(QUEUE_INDEXES),),
        ).fetchall()
        queued = conn.execute("SELECT count(*) FROM nq_jobs").fetchone()
    assert sorted(indexes) == sorted((name, True) for name in QUEUE_INDEXES)
    assert queued is not None and queued[0] >= BACKLOG + len(load.created)
