"""Which engine the database is: plain PostgreSQL, or a Citus coordinator with worker nodes.

Two questions with two answers. `migrate` distributes the schema when Citus's extension is
installed and at least one worker node is registered (`citus_worker_nodes`). The running roles
use the Citus statements once the schema *is* distributed (`database_engine_read`): a node
registered before `migrate` has run leaves every table on the coordinator, where only the plain
statements work (docs/scaling.md, "When the roles switch"). `/status` reports the latter.

The answer changes only by `migrate` or an operator's action (adding or removing a node), so
each process reads it at most once per `ttl_seconds` instead of on every `/status` or scrape.
With it comes the engine's driver (driver.py), the one place the repositories' statements take
their engine's shape: a running role switches drivers within that TTL of the `migrate` that
distributes the schema.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from notify_queue.models import DatabaseEngine, Engine
from notify_queue.repositories.db import Connection, Database
from notify_queue.repositories.driver import Driver
from notify_queue.repositories.engine_citus import CitusDriver
from notify_queue.repositories.engine_postgresql import PostgresDriver

DRIVERS: dict[Engine, Driver] = {Engine.POSTGRESQL: PostgresDriver(), Engine.CITUS: CitusDriver()}

# Long enough that a scrape every few seconds costs no query, short enough that `/status` shows a
# node added or removed within half a minute.
ENGINE_TTL_SECONDS = 30.0


async def citus_worker_nodes(conn: Connection) -> int:
    """The worker nodes registered with this database's Citus; 0 without the extension."""
    row = await conn.fetch_one("database_engine_citus_installed")
    if row is None or not row["installed"]:
        return 0
    nodes = await conn.fetch_one("database_engine_citus_worker_nodes")
    return int(nodes["n"]) if nodes is not None else 0


async def database_engine_read(conn: Connection) -> DatabaseEngine:
    """Read the engine the roles run on now (up to three statements on `conn`; no cache): Citus
    once `migrate` has distributed the schema over worker nodes, else plain PostgreSQL."""
    workers = await citus_worker_nodes(conn)
    if not workers:
        return DatabaseEngine(Engine.POSTGRESQL, 0)
    layout = await conn.fetch_one("database_engine_citus_distributed")
    if layout is None or not layout["distributed"]:
        return DatabaseEngine(Engine.POSTGRESQL, 0)
    return DatabaseEngine(Engine.CITUS, workers)


class EngineRepository:
    """The database's engine, cached for `ttl_seconds` (per instance: one per process)."""

    def __init__(
        self,
        db: Database,
        *,
        ttl_seconds: float = ENGINE_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._db = db
        self._ttl_seconds = ttl_seconds
        self._clock = clock
        self._cached: tuple[float, DatabaseEngine] | None = None

    async def engine_get(self, *, conn: Connection | None = None) -> DatabaseEngine:
        """The cached answer while it is younger than the TTL, else a fresh read (on `conn` when
        given, so a caller already holding a connection takes no second one from the pool)."""
        now = self._clock()
        if self._cached is not None and now - self._cached[0] < self._ttl_seconds:
            return self._cached[1]
        if conn is None:
            async with self._db.connection() as own:
                engine = await database_engine_read(own)
        else:
            engine = await database_engine_read(conn)
        self._cached = (now, engine)
        return engine

    async def driver(self, *, conn: Connection | None = None) -> Driver:
        """The driver of the engine `engine_get` answers (the same cache)."""
        return DRIVERS[(await self.engine_get(conn=conn)).engine]
