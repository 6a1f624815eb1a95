"""The runtime role on Citus (the scenario: tests/test_database_roles.py): a login in
`notify_queue_runtime` runs the real API and worker on the distributed schema, delivers, and may
not change the schema."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.citus.test_layout import migrate
from tests.test_database_roles import runtime_role_runs_the_api_and_a_worker

pytestmark = pytest.mark.citus


async def test_the_runtime_role_runs_the_api_and_a_worker_on_citus(
    citus_database: str, tmp_path: Path
) -> None:
    migrate(citus_database)
    await runtime_role_runs_the_api_and_a_worker(citus_database, tmp_path)
