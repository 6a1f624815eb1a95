"""The upgrade tests' fixtures: the operator tests' local control plane (kube-apiserver + etcd with
this checkout's CRDs installed), and an empty database (no schema: each release migrates it)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from notify_queue.embedded import EmbeddedPostgres
from tests.operator.conftest import kube, namespace

__all__ = ["empty_database_url", "kube", "namespace"]


@pytest.fixture
def empty_database_url(pg_server: EmbeddedPostgres) -> Iterator[str]:
    name = f"upgrade_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield pg_server.url(name)
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
