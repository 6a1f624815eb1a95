"""Migration steps that run outside a transaction: index builds on the hot tables.

An index on the queue is built with `CREATE INDEX CONCURRENTLY`, which blocks no create or claim
(a plain build's SHARE lock holds every write back for its length) and which PostgreSQL refuses
inside a transaction. So a step headed `-- transaction: none` holds only such builds, `CREATE
[UNIQUE] INDEX CONCURRENTLY IF NOT EXISTS <name> ON ...`, and `schema.migrate` runs them here one
statement at a time, then records the step (docs/upgrading.md, "Index builds on the queue").
"""

from __future__ import annotations

import logging
import re

from notify_queue.repositories.db import Connection

log = logging.getLogger(__name__)

# What a step outside a transaction may hold: concurrent index builds that a rerun skips once
# built (IF NOT EXISTS), named so an invalid leftover can be found and dropped.
_CONCURRENT_INDEX = re.compile(
    r"^CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+(\w+)\s+ON\s",
    re.IGNORECASE,
)


def concurrent_indexes(script: str, filename: str) -> tuple[tuple[str, str], ...]:
    """A step's statements as (index name, statement), in file order; a ValueError for anything
    but a concurrent index build (nothing else may run outside a transaction)."""
    code = "\n".join(line.split("--", 1)[0] for line in script.splitlines())
    found = []
    for statement in (s.strip() for s in code.split(";")):
        if not statement:
            continue
        match = _CONCURRENT_INDEX.match(statement)
        if match is None:
            raise ValueError(
                f"{filename}: a `transaction: none` step holds only concurrent index builds "
                f"(`create index concurrently if not exists`), not {statement[:60]!r}"
            )
        found.append((match[1], statement))
    if not found:
        raise ValueError(f"{filename}: a `transaction: none` step with no index to build")
    return tuple(found)


async def build(conn: Connection, step: str, indexes: tuple[tuple[str, str], ...]) -> None:
    """Build each index with CONCURRENTLY, outside a transaction: creates and claims go on
    meanwhile (its SHARE UPDATE EXCLUSIVE lock blocks no write; its waits for older transactions
    hold nobody back, so no lock timeout here). A build that was interrupted (a killed migrate, a
    lost connection, a deadlock) leaves an INVALID index that IF NOT EXISTS would keep: it is
    dropped and built again. Returns once every index is valid, so the caller records the step
    only then; the migrators' advisory lock keeps a second one from dropping a build under way."""
    for name, statement in indexes:
        state = await conn.fetch_one("migration_index_state", {"name": name})
        if state is not None and not state["valid"]:
            log.warning(
                "migration %s: index %s was left invalid by an interrupted build; "
                "dropping and building it again",
                step,
                name,
            )
            await conn.execute_on("migration_index_drop_concurrently", {"name": name})
        await conn.execute_script(statement)
        state = await conn.fetch_one("migration_index_state", {"name": name})
        if state is None or not state["valid"]:
            raise RuntimeError(f"{step}: index {name} is not valid after its build")
