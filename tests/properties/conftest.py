"""Fixtures and settings of the property tests.

Example counts are small by default so the suite stays quick; the long fuzz run raises them all
with one variable: `NOTIFY_QUEUE_PROPERTY_EXAMPLES=2000 .venv/bin/pytest tests/properties`.
Tests that touch the database reuse one fresh database per test function and empty its tables
before each example (see `reset`), which is why they suppress Hypothesis's function-scoped
fixture health check.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from psycopg.rows import dict_row

_SCALE = os.environ.get("NOTIFY_QUEUE_PROPERTY_EXAMPLES")


def examples(default: int) -> int:
    """`default` examples, or the fuzz run's count when NOTIFY_QUEUE_PROPERTY_EXAMPLES is set."""
    return int(_SCALE) if _SCALE else default


def db_settings(default_examples: int) -> settings:
    return settings(
        max_examples=examples(default_examples),
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


class Raw:
    """A test's own connection for setting up histories and reading rows (parameterised)."""

    def __init__(self, conn: psycopg.AsyncConnection[dict[str, Any]]) -> None:
        self.conn = conn

    async def rows(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        cur = await self.conn.execute(query, params)  # type: ignore[arg-type]
        return list(await cur.fetchall()) if cur.description else []

    async def reset(self) -> None:
        await self.conn.execute(
            "TRUNCATE nq_jobs, nq_delivery_log, nq_idempotency_keys, nq_rate_windows, nq_counters,"
            " nq_webhook_events, nq_policies"
        )


@pytest.fixture
async def raw(database_url: str) -> AsyncIterator[Raw]:
    async with await psycopg.AsyncConnection.connect(
        database_url, autocommit=True, row_factory=dict_row
    ) as conn:
        yield Raw(conn)
