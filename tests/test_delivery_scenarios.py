"""The delivery scenario table (tests/scenarios/table.py) on plain PostgreSQL: one database for
the whole table, each scenario through the worker's claim and completion on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from notify_queue.embedded import EmbeddedPostgres
from notify_queue.repositories.db import Database
from tests.api.support import api_client
from tests.conftest import cloned_database
from tests.scenarios.table import SCENARIOS, Scenario, play


@pytest.fixture(scope="module")
def scenario_database(pg_server: EmbeddedPostgres) -> Iterator[str]:
    with cloned_database(pg_server, prefix="scenarios") as url:
        yield url


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_a_delivery_scenario_on_postgresql(
    scenario_database: str, scenario: Scenario
) -> None:
    db = Database(scenario_database, pool_size=4, name="scenarios")
    await db.open()
    try:
        async with api_client(scenario_database, db=db) as http:
            outcome = await play(scenario_database, db, http, scenario)
    finally:
        await db.close()
    assert outcome == scenario.expected
