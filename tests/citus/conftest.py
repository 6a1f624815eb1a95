"""Fixtures of the Citus tests: one cluster (a coordinator and two worker nodes) per session.

The cluster starts only when a test asks for it; where Citus is not built or installed
(`make citus`, or `NOTIFY_QUEUE_CITUS_PG_CONFIG`), every test that asks is skipped with the one
line saying why. Tests share the nodes and each makes its own database (`citus_database`).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from tests.citus.cluster import CitusCluster, CitusUnavailable, find_pg_config
from tests.support import directory_outside_pytest, missing_component

_counter = itertools.count()


@pytest.fixture(scope="session")
def citus_cluster() -> Iterator[CitusCluster]:
    try:
        pg_config = find_pg_config()
    except CitusUnavailable as reason:
        missing_component("citus", str(reason))
    with directory_outside_pytest("notify-queue-citus-") as root:
        with CitusCluster(root, pg_config) as cluster:
            yield cluster


@pytest.fixture
def citus_database(citus_cluster: CitusCluster) -> Iterator[str]:
    """A fresh database on every node, the nodes registered in it; the coordinator's URL."""
    name = f"t_{os.getpid()}_{next(_counter)}"
    url = citus_cluster.create_database(name)
    try:
        yield url
    finally:
        citus_cluster.drop_database(name)
