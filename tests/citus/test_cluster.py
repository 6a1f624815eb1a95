"""The Citus cluster harness (tests/citus/cluster.py) does what the Citus tests rely on: three
nodes up and registered, a hash-distributed table whose rows land on both worker nodes, a worker
node stopped and started again during the session with every row readable afterwards, and the
coordinator naming the engine once `migrate` has distributed the schema (docs/scaling.md)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from notify_queue.models import DatabaseEngine, Engine
from notify_queue.repositories.db import Database
from notify_queue.repositories.engine import EngineRepository
from notify_queue.repositories.schema import migrate
from tests.citus.cluster import CitusCluster

pytestmark = pytest.mark.citus


def rows_per_worker(cluster: CitusCluster, url: str, table: str) -> dict[int, int]:
    """Rows of `table` per worker node's port, from Citus's own catalog of shard placements."""
    with psycopg.connect(url) as conn:
        query = sql.SQL(
            """
            SELECT nodeport, sum(n)::int FROM (
                SELECT get_shard_id_for_distribution_column(%s, bucket) AS shardid, count(*) AS n
                FROM {} GROUP BY 1
            ) per_shard JOIN pg_dist_placement USING (shardid) JOIN pg_dist_node USING (groupid)
            GROUP BY nodeport
            """
        ).format(sql.Identifier(table))
        rows = conn.execute(query, [table]).fetchall()
    return {int(port): int(n) for port, n in rows}


def test_three_nodes_are_up_and_the_workers_registered(citus_cluster: CitusCluster) -> None:
    with psycopg.connect(citus_cluster.url()) as conn:
        nodes = conn.execute(
            "SELECT nodeport, groupid = 0 FROM pg_dist_node WHERE isactive ORDER BY groupid"
        ).fetchall()
        workers = conn.execute("SELECT node_name, node_port FROM citus_get_active_worker_nodes()")

        assert nodes[0] == (citus_cluster.coordinator.port, True)
        assert {port for port, _ in nodes[1:]} == {w.port for w in citus_cluster.workers}
        assert {port for _, port in workers} == {w.port for w in citus_cluster.workers}
    for node in citus_cluster.nodes:
        with psycopg.connect(node.url()) as conn:
            assert conn.execute(
                "SELECT extname FROM pg_extension WHERE extname = 'citus'"
            ).fetchone()


def test_a_distributed_table_is_written_on_both_workers_and_read_after_a_worker_restart(
    citus_cluster: CitusCluster, citus_database: str
) -> None:
    with psycopg.connect(citus_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (bucket integer NOT NULL, id bigserial, body text)")
        conn.execute("SELECT create_distributed_table('items', 'bucket')")
        conn.execute(
            "INSERT INTO items (bucket, body)"
            " SELECT b % 32, 'row ' || b FROM generate_series(1, 1000) b"
        )

    before = rows_per_worker(citus_cluster, citus_database, "items")
    assert set(before) == {w.port for w in citus_cluster.workers}
    assert all(n > 0 for n in before.values()) and sum(before.values()) == 1000

    citus_cluster.restart_worker(0)

    # The coordinator's cached connection to the restarted node is dead; Citus notices on first
    # use and opens a new one, so the first read after the restart already succeeds.
    with psycopg.connect(citus_database) as conn:
        assert conn.execute("SELECT count(*), count(DISTINCT bucket) FROM items").fetchone() == (
            1000,
            32,
        )
    assert rows_per_worker(citus_cluster, citus_database, "items") == before


def test_a_worker_node_can_be_crashed_and_started_again(citus_cluster: CitusCluster) -> None:
    def workers_answering() -> list[bool]:
        with psycopg.connect(citus_cluster.url(), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT success FROM run_command_on_workers('SELECT 1') ORDER BY nodeport"
            ).fetchall()
        return [bool(success) for (success,) in rows]

    down = sorted(w.port for w in citus_cluster.workers).index(citus_cluster.workers[1].port)
    citus_cluster.stop_worker(1, mode="immediate")
    answering = workers_answering()
    citus_cluster.start_worker(1)

    assert answering == [i != down for i in range(2)]
    assert workers_answering() == [True, True]


async def test_the_coordinator_is_citus_with_two_worker_nodes_once_the_schema_is_distributed(
    citus_database: str,
) -> None:
    async with Database(citus_database, pool_size=1) as db:
        registered = await EngineRepository(db).engine_get()
        await migrate(db)
        engine = await EngineRepository(db).engine_get()

    assert registered == DatabaseEngine(Engine.POSTGRESQL, 0)  # nodes, but nothing distributed
    assert engine == DatabaseEngine(Engine.CITUS, 2)


async def test_a_coordinator_without_worker_nodes_is_plain_postgresql(
    citus_cluster: CitusCluster,
) -> None:
    name = "t_no_workers"
    with psycopg.connect(citus_cluster.coordinator.url("postgres"), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        with psycopg.connect(citus_cluster.coordinator.url(name), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION citus")
        async with Database(citus_cluster.coordinator.url(name), pool_size=1) as db:
            engine = await EngineRepository(db).engine_get()
    finally:
        with psycopg.connect(citus_cluster.coordinator.url("postgres"), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {name} WITH (FORCE)")

    assert engine == DatabaseEngine(Engine.POSTGRESQL, 0)


def test_a_database_is_dropped_with_a_prepared_transaction_left_on_a_worker_node(
    citus_cluster: CitusCluster,
) -> None:
    """A worker node restarted between the two phases of a commit keeps the prepared transaction
    until Citus's recovery resolves it (within a minute); the harness's teardown must not fail on
    it meanwhile. Negative control, by hand: without the resolution in `drop_database`, DROP
    DATABASE fails with "is being used by prepared transactions"."""
    citus_cluster.create_database("t_prepared_left")
    worker = citus_cluster.workers[0]
    with psycopg.connect(worker.url("t_prepared_left"), autocommit=True) as conn:
        conn.execute("CREATE TABLE left_behind (id integer)")
        conn.execute("BEGIN")
        conn.execute("INSERT INTO left_behind VALUES (1)")
        conn.execute("PREPARE TRANSACTION 'left_by_a_restarted_node'")
    citus_cluster.drop_database("t_prepared_left")
    with psycopg.connect(worker.url("postgres")) as conn:
        assert not conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = 't_prepared_left'"
        ).fetchone()
        assert not conn.execute("SELECT 1 FROM pg_prepared_xacts").fetchone()
