"""When the roles switch to the Citus statements (docs/scaling.md, "When the roles switch"): on
the distributed layout, not on the node list.

An installation on plain PostgreSQL gets Citus and its worker nodes registered, and `migrate` has
not run since: every table is still on the coordinator. The API and the workers keep the plain
statements there (`/status` says `postgresql`) and create and deliver; once `migrate` has
distributed the schema, new processes use the Citus statements (`citus`, 2 nodes) and deliver
too. Real parts: the cluster of tests/citus/cluster.py, `notify-queue migrate|api|worker` as
processes, the counting HTTP provider of tests/citus/test_end_to_end.py."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import pytest

from tests.citus.cluster import CitusCluster
from tests.citus.test_end_to_end import peers, statuses, workers
from tests.citus.test_growth import _create_all
from tests.citus.test_layout import layout, migrate
from tests.support import eventually, running_api

pytestmark = pytest.mark.citus


async def database_status(base: str) -> dict[str, object]:
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        answer: dict[str, object] = (await http.get("/status")).json()["database"]
        return answer


async def test_the_roles_keep_the_plain_statements_until_migrate_has_distributed_the_schema(
    citus_cluster: CitusCluster, tmp_path: Path
) -> None:
    name = f"switch_{os.getpid()}"
    url = citus_cluster.create_plain_database(name)
    try:
        migrate(url)
        # The nodes registered, the schema not distributed yet.
        await asyncio.to_thread(citus_cluster.add_citus, name)
        assert layout(url) == {}
        async with peers() as (provider, hooks):
            async with running_api(url, tmp_path / "api-registered.log") as base:
                before = await _create_all(base, "before", 10)
                with workers(url, tmp_path, provider.url, hooks.url):

                    async def sent_before() -> bool:
                        return statuses(url) == {"SENT": 10}

                    await eventually(sent_before, timeout=120, what="10 SENT before the layout")
                assert await database_status(base) == {"engine": "postgresql", "workerNodes": 0}

            migrate(url)
            assert layout(url)["nq_jobs"][0] == "h"
            async with running_api(url, tmp_path / "api-distributed.log") as base:
                assert await database_status(base) == {"engine": "citus", "workerNodes": 2}
                after = await _create_all(base, "after", 10)
                with workers(url, tmp_path, provider.url, hooks.url):

                    async def sent_after() -> bool:
                        return statuses(url) == {"SENT": 20}

                    await eventually(sent_after, timeout=180, what="20 SENT on the layout")
        assert set(provider.sent) == {*before, *after}
        assert set(provider.sent.values()) == {1}
    finally:
        citus_cluster.drop_database(name)
