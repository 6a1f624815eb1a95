"""Versioned schema migrations: `migrations/NNNN_<name>.sql`, applied in order, each once.

Safe to run again (applied versions are recorded in nq_schema_migrations) and from several
processes at once: the whole run holds a session-level advisory lock, so a second process waits
and then finds nothing left to do. Each migration runs in its own transaction with its record.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import resources

from notify_queue.repositories.db import Database

log = logging.getLogger(__name__)

# An arbitrary constant that identifies "Notify Queue is migrating" among advisory locks.
_MIGRATION_LOCK_KEY = 7_305_826_031
_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    script: str


def available_migrations() -> list[Migration]:
    found = []
    for entry in resources.files("notify_queue.repositories.migrations").iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    return sorted(found, key=lambda m: m.version)


def latest_version() -> int:
    return available_migrations()[-1].version


async def migrate(db: Database, *, target: int | None = None) -> list[int]:
    """Apply every migration not applied yet (up to `target`, if given: the tests of a migration
    fill the schema before it); return the versions applied by this call."""
    applied_now: list[int] = []
    async with db.connection() as conn:
        await conn.execute("migration_lock", {"key": _MIGRATION_LOCK_KEY})
        try:
            await conn.execute_script(
                "CREATE TABLE IF NOT EXISTS nq_schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {row["version"] for row in await conn.fetch_all("migration_versions")}
            for migration in available_migrations():
                if migration.version in done or (target is not None and migration.version > target):
                    continue
                async with conn.transaction():
                    await conn.execute_script(migration.script)
                    await conn.execute(
                        "migration_record", {"version": migration.version, "name": migration.name}
                    )
                log.info("applied migration %04d_%s", migration.version, migration.name)
                applied_now.append(migration.version)
        finally:
            await conn.execute("migration_unlock", {"key": _MIGRATION_LOCK_KEY})
    return applied_now


async def current_version(db: Database) -> int | None:
    """The newest applied version, or None when the schema was never created."""
    async with db.connection() as conn:
        present = await conn.fetch_one("migration_table_exists")
        if not present or not present["present"]:
            return None
        row = await conn.fetch_one("migration_current")
    return None if row is None else row["version"]
