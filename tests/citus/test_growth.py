"""Growing onto Citus and within it, as docs/scaling.md tells an operator to (issue 21, part 5):
an installation on plain PostgreSQL moved onto Citus with its history and its backlog, and a
worker node added to a running cluster and given its share of the shards while workers deliver.

Real parts: the cluster of tests/citus/cluster.py (and one node more for the second test),
`notify-queue migrate|api|worker` as processes, the counting HTTP provider of
tests/citus/test_end_to_end.py. What each checks is what the procedure must not lose: every
notification sent once, the history readable, the idempotency keys still deciding 200 and 409."""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.citus.cluster import HOST, CitusCluster
from tests.citus.test_cluster import rows_per_worker
from tests.citus.test_end_to_end import peers, statuses, workers
from tests.citus.test_layout import migrate
from tests.support import eventually, running_api

pytestmark = pytest.mark.citus

_names = itertools.count()


def _create(i: int, tag: str, body: str = "hello") -> dict[str, object]:
    # Each its own recipient: the workers' rate limit (5 per recipient) holds nothing back.
    return {
        "channel": "email",
        "recipient": f"{tag}-{i}@example.com",
        "body": body,
        "idempotencyKey": f"{tag}-{i}",
    }


async def _create_all(base: str, tag: str, count: int) -> list[str]:
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        answers = [await http.post("/notifications", json=_create(i, tag)) for i in range(count)]
    assert [a.status_code for a in answers] == [201] * count, answers[-1].text
    return [a.json()["id"] for a in answers]


async def test_an_installation_on_plain_postgresql_moves_onto_citus_with_its_history(
    citus_cluster: CitusCluster, tmp_path: Path
) -> None:
    name = f"plain_{os.getpid()}_{next(_names)}"
    url = citus_cluster.create_plain_database(name)
    try:
        migrate(url)
        async with peers() as (provider, hooks):
            async with running_api(url, tmp_path / "api-plain.log") as base:
                async with httpx.AsyncClient(base_url=base) as http:
                    status = (await http.get("/status")).json()
                    assert status["database"] == {"engine": "postgresql", "workerNodes": 0}
                    put = await http.put("/recipients/moved", json={"email": "moved@example.com"})
                    assert put.status_code in (200, 201), put.text
                sent_before = await _create_all(base, "before", 20)
                with workers(url, tmp_path, provider.url, hooks.url):

                    async def all_sent() -> bool:
                        return statuses(url).get("SENT", 0) == 20

                    await eventually(all_sent, timeout=120, what="20 SENT on plain PostgreSQL")
                # The backlog the move must carry over: accepted, not delivered yet.
                backlog = await _create_all(base, "backlog", 20)

            # The move, with the roles stopped (docs/scaling.md): Citus on every node of this
            # database, then `migrate` distributes the tables with their rows.
            await asyncio.to_thread(citus_cluster.add_citus, name)
            migrate(url)
            migrate(url)  # a second run changes nothing
            per_worker = rows_per_worker(citus_cluster, url, "nq_jobs")
            assert sorted(per_worker) == sorted(w.port for w in citus_cluster.workers)
            assert sum(per_worker.values()) == 20
            assert sum(rows_per_worker(citus_cluster, url, "nq_delivery_log").values()) == 20
            # The coordinator's own copies of the rows, invisible once distributed, are gone.
            with psycopg.connect(url) as conn:
                local = conn.execute(
                    "SELECT sum(pg_relation_size(c.oid))::int FROM pg_class c"
                    " WHERE c.relname IN ('nq_jobs', 'nq_idempotency_keys')"
                    " OR c.oid IN (SELECT inhrelid FROM pg_inherits"
                    "              WHERE inhparent = 'nq_delivery_log'::regclass)"
                ).fetchone()
            assert local == (0,)

            async with running_api(url, tmp_path / "api-citus.log") as base:
                async with httpx.AsyncClient(base_url=base, timeout=60) as http:
                    status = (await http.get("/status")).json()
                    assert status["database"] == {"engine": "citus", "workerNodes": 2}
                    old = (await http.get(f"/notifications/{sent_before[3]}")).json()
                    assert (old["id"], old["status"]) == (sent_before[3], "SENT")
                    # The keys moved too: the same request is the same notification, another
                    # request with that key a conflict, wherever the row is now.
                    for tag, ids in (("before", sent_before), ("backlog", backlog)):
                        again = await http.post("/notifications", json=_create(3, tag))
                        other = await http.post("/notifications", json=_create(3, tag, "other"))
                        assert (again.status_code, again.json()["id"]) == (200, ids[3])
                        assert other.status_code == 409, other.text
                    after = await _create_all(base, "after", 10)
                    # The recipients (a reference table now) moved with the rest.
                    recipient = (await http.get("/recipients/moved")).json()
                    assert recipient["email"] == "moved@example.com"
                    targeted = await http.post(
                        "/notifications",
                        json={"recipientId": "moved", "body": "x", "idempotencyKey": "targeted"},
                    )
                    assert targeted.status_code == 201, targeted.text
                    # One per channel the recipient has: email alone here.
                    (made,) = targeted.json()["notifications"]
                    after.append(made["id"])
                with workers(url, tmp_path, provider.url, hooks.url):

                    async def every_one_sent() -> bool:
                        return statuses(url) == {"SENT": 51}

                    await eventually(every_one_sent, timeout=180, what="all 51 SENT on Citus")
        assert set(provider.sent) == {*sent_before, *backlog, *after}
        assert set(provider.sent.values()) == {1}
    finally:
        citus_cluster.drop_database(name)


async def test_a_worker_node_added_takes_its_shards_while_workers_deliver(
    citus_cluster: CitusCluster, citus_database: str, tmp_path: Path
) -> None:
    url = citus_database
    name = url.rsplit("/", 1)[1]
    migrate(url)
    with citus_cluster.extra_worker() as extra:
        async with peers() as (provider, hooks), running_api(url, tmp_path / "api.log") as base:
            first = await _create_all(base, "first", 40)
            with workers(url, tmp_path, provider.url, hooks.url):
                # The node joins as an operator adds one (docs/scaling.md): the database and
                # the extension on it, then citus_add_node on the coordinator, then the rebalance
                # in the background while creates and deliveries go on.
                with psycopg.connect(extra.url("postgres"), autocommit=True) as conn:
                    conn.execute(f'CREATE DATABASE "{name}"')
                with psycopg.connect(extra.url(name), autocommit=True) as conn:
                    conn.execute("CREATE EXTENSION citus")
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("SELECT citus_add_node(%s, %s)", [HOST, extra.port])
                    conn.execute("SELECT citus_rebalance_start()")
                during = await _create_all(base, "during", 40)
                with psycopg.connect(url, autocommit=True) as conn:
                    await asyncio.to_thread(conn.execute, "SELECT citus_rebalance_wait()")
                later = await _create_all(base, "later", 20)

                async def every_one_sent() -> bool:
                    return statuses(url) == {"SENT": 100}

                await eventually(every_one_sent, timeout=240, what="all 100 SENT")
            async with httpx.AsyncClient(base_url=base) as http:
                status = (await http.get("/status")).json()
        assert status["database"] == {"engine": "citus", "workerNodes": 3}
        with psycopg.connect(url) as conn:
            moved = conn.execute(
                "SELECT count(*) FROM citus_shards WHERE nodeport = %s", [extra.port]
            ).fetchone()
        assert moved is not None and moved[0] > 0
        assert extra.port in rows_per_worker(citus_cluster, url, "nq_delivery_log")
        assert set(provider.sent) == {*first, *during, *later}
        assert set(provider.sent.values()) == {1}
