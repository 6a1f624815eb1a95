"""The delivery scenario table (tests/scenarios/table.py) on Citus: one database for the whole
table, its schema distributed by `notify-queue migrate`, each scenario through the worker's
claim and completion on the coordinator (the Citus functions)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from notify_queue.repositories.db import Database
from tests.api.support import api_client
from tests.citus.cluster import CitusCluster
from tests.citus.test_layout import migrate
from tests.scenarios.table import SCENARIOS, Scenario, play

pytestmark = pytest.mark.citus


@pytest.fixture(scope="module")
def scenario_database(citus_cluster: CitusCluster) -> Iterator[str]:
    name = f"scenarios_{os.getpid()}"
    url = citus_cluster.create_database(name)
    try:
        migrate(url)
        yield url
    finally:
        citus_cluster.drop_database(name)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_a_delivery_scenario_on_citus(scenario_database: str, scenario: Scenario) -> None:
    db = Database(scenario_database, pool_size=4, name="scenarios")
    await db.open()
    try:
        async with api_client(scenario_database, db=db) as http:
            outcome = await play(scenario_database, db, http, scenario)
    finally:
        await db.close()
    assert outcome == scenario.expected
