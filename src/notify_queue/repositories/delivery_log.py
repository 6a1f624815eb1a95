"""The delivery log's lifecycle: partitions created ahead of time, dropped after the retention.

Finished notifications are in `nq_delivery_log`, one partition per UTC day of `finished_at`
(migration 0008). Retention never deletes rows: a partition wholly older than the retention
loses its idempotency keys (in chunks), is detached CONCURRENTLY (writers never wait) and dropped
with its rows' counts. Every step is safe to repeat, so a run cut short is finished by the next.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import psycopg

from notify_queue.repositories.db import Connection, Database
from notify_queue.repositories.driver import LogKeysChunk
from notify_queue.repositories.engine import EngineRepository

log = logging.getLogger(__name__)

_UUID_ZERO = uuid.UUID(int=0)

# The log's partitioned indexes whose parts of partitions with rows the workers build: made ON ONLY
# the log by their migration (0009, 0075), so no migration reads the log's history.
LOG_INDEXES = ("nq_delivery_log_unsent", "nq_delivery_log_provider_message")


@dataclass(frozen=True, slots=True)
class Dropped:
    partition: str
    rows: int


class DeliveryLogRepository:
    def __init__(self, db: Database, engine: EngineRepository | None = None) -> None:
        self._db = db
        # On Citus the keys are forgotten without locking the partition's rows and the partition
        # is detached without CONCURRENTLY (neither runs there: docs/scaling.md).
        self._engine = engine or EngineRepository(db)

    async def partitions_prepare(self, *, days_ahead: int = 7) -> int:
        """Create the partitions from today to `days_ahead` days ahead; return how many were new."""
        row = await self._db.fetch_one("delivery_log_prepare", {"days_ahead": days_ahead})
        return int(row["created"]) if row else 0

    async def partitions_index(self) -> list[str]:
        """Build and attach each partition's part of the log's indexes that a migration left to
        the workers (`LOG_INDEXES`: the partitions that had rows); return the partitions done.
        Does nothing while another process runs it. CONCURRENTLY, so on a session connection
        (`_alone`)."""
        done: list[str] = []
        async with self._alone("nq delivery log indexes") as conn:
            if conn is None:
                return done
            for parent in LOG_INDEXES:
                for m in await conn.fetch_all("delivery_log_index_missing", {"index": parent}):
                    index = {"index": m["index_name"]}
                    try:
                        if m["index_valid"] is False:  # a build cut short
                            await conn.execute_on("delivery_log_index_drop", index)
                        if not m["index_valid"]:
                            await conn.execute_on(
                                "delivery_log_index_build",
                                index | {"partition": m["partition_name"]},
                                catalog={"using": m["index_using"]},
                            )
                        await conn.execute_on(
                            "delivery_log_index_attach", index | {"parent": parent}
                        )
                    except psycopg.errors.DatabaseError as exc:
                        # Left for the next run (an invalid part is dropped and built again);
                        # the partition is read without this index meanwhile.
                        log.warning(
                            "delivery log: %s not in %s yet: %s", m["partition_name"], parent, exc
                        )
                        continue
                    if m["partition_name"] not in done:
                        done.append(m["partition_name"])
        return done

    @asynccontextmanager
    async def _alone(self, run: str) -> AsyncIterator[Connection | None]:
        """A session connection (`Database.session`) holding `run`'s advisory lock, or None
        while another process holds it. Session-level: a run spans transactions (DETACH and
        CREATE INDEX ... CONCURRENTLY cannot run inside one), which a transaction-mode pooler
        would take on one server connection and leave held there."""
        async with self._db.session() as conn:
            locked = await conn.fetch_one("delivery_log_lock", {"run": run})
            if not locked or not locked["locked"]:
                yield None
                return
            try:
                yield conn
            finally:
                await conn.execute("delivery_log_unlock", {"run": run})

    async def digests_forget(self, *, retention_seconds: float) -> int:
        """Remove digests closed before the retention (docs/digests.md); return how many."""
        return await self._db.execute("digests_forget", {"retention_seconds": retention_seconds})

    async def partitions_drop_expired(
        self, *, retention_seconds: float, keys_per_chunk: int = 10_000
    ) -> list[Dropped]:
        """Drop every partition wholly older than the retention. Does nothing while another
        process runs it. DETACH ... CONCURRENTLY, so on a session connection (`_alone`); a user
        that does not own the log (the runtime role) has nq_delivery_log_retire do it."""
        dropped: list[Dropped] = []
        async with self._alone("nq delivery log retention") as conn:
            if conn is None:
                return dropped
            driver = await self._engine.driver(conn=conn)
            ownership = await conn.fetch_one("delivery_log_owned")
            owned = bool(ownership and ownership["owned"])
            expired = await conn.fetch_all(
                "delivery_log_expired", {"retention_seconds": retention_seconds}
            )
            for p in expired:
                name = p["partition_name"]
                after = _UUID_ZERO
                while True:
                    chunk: LogKeysChunk = {
                        "partition": name,
                        "after": after,
                        "limit": keys_per_chunk,
                    }
                    row = await driver.delivery_log_forget_keys(conn, chunk)
                    if row is None or row["last_id"] is None:
                        break
                    after = row["last_id"]
                if not owned:  # the runtime role: as the owner, with a plain DETACH
                    row = await conn.fetch_one("delivery_log_retire", {"partition": name})
                    dropped.append(Dropped(name, int(row["dropped"]) if row else 0))
                    continue
                if p["detach_pending"]:  # a concurrent detach was interrupted
                    await conn.execute_on("delivery_log_detach_finalize", {"partition": name})
                elif p["attached"]:
                    await driver.delivery_log_detach(conn, partition=name)
                row = await conn.fetch_one("delivery_log_drop", {"partition": name})
                dropped.append(Dropped(name, int(row["dropped"]) if row else 0))
        return dropped
