"""The database engine as `/status` reports it (CONTRACT section 11): plain PostgreSQL is
`postgresql` with 0 worker nodes, also when the server could load Citus but this database has no
extension; the answer is read at most once per TTL per process. The Citus side is in
tests/citus/test_cluster.py and tests/citus/test_engine_switch.py."""

from __future__ import annotations

from notify_queue.models import DatabaseEngine, Engine
from notify_queue.repositories.db import Database
from notify_queue.repositories.engine import EngineRepository


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_plain_postgresql_is_postgresql_with_no_worker_nodes(db: Database) -> None:
    engine = await EngineRepository(db).engine_get()

    assert engine == DatabaseEngine(Engine.POSTGRESQL, 0)


async def test_the_engine_is_read_once_per_ttl(db: Database) -> None:
    clock = Clock()
    repository = EngineRepository(db, ttl_seconds=30, clock=clock)
    reads: list[str] = []
    original = db.connection

    def counting_connection():  # type: ignore[no-untyped-def]
        reads.append("read")
        return original()

    db.connection = counting_connection  # type: ignore[method-assign]

    await repository.engine_get()
    clock.now += 29
    await repository.engine_get()
    assert reads == ["read"]

    clock.now += 2
    await repository.engine_get()
    assert reads == ["read", "read"]
