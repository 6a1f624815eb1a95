"""Versioned schema migrations, expand/contract: `migrations/NNNN_<name>.sql`, applied in order,
each once (docs/upgrading.md, and the rules in `migrations/__init__.py`).

Safe to run again and from several processes at once: the whole run holds a session-level
advisory lock, so a second process waits (polling for it) and then finds nothing left to
do. Each migration runs
in its own transaction with its record, except a step headed `-- transaction: none`: index builds
on the hot tables, `CREATE INDEX CONCURRENTLY`, which no transaction may hold. Those run one by
one outside a transaction, and resume where an interrupted run left them: an index that a broken
build left INVALID is dropped (concurrently) and built again, and the step is recorded only once
every index it builds is valid (docs/upgrading.md, "Index builds on the queue").

Beside running processes. `migrate` runs while the previous release serves, whose transactions
hold the tables' locks for a moment each and take them in their own order. A migration's
statements wait for a lock at most `LOCK_TIMEOUT` (while one waits for an ACCESS EXCLUSIVE lock,
every query after it on that table queues behind it, so the wait is kept short); a migration
that gives up there, or loses a deadlock to such a transaction, is rolled back whole and run
again, up to `LOCK_ATTEMPTS` times, a little later each time.

Two ledgers. Versions up to `BASELINE_VERSION` (0.1.0's last) are recorded in
nq_schema_migrations as 0.1.0 recorded them: 0.1.0's readiness and operator compare that table's
max(version) with 8, so a newer number there would take every 0.1.0 pod out of service the moment
the pre-upgrade hook migrated. Every later step goes to nq_schema_steps with its phase.

Functions. A migration changes tables, indexes and types only. Every PL/pgSQL or SQL function is
source code in `functions/<name>.sql` (CREATE OR REPLACE), which `migrate` applies whole after
the migrations, so today's definition of a function is in one file. It is applied again only when
its text changed or a step ran (a digest of the text is kept in nq_schema_functions), so a
`migrate` with nothing new leaves the catalog alone. The bodies are defined with
`check_function_bodies` off, as pg_dump restores them: a SQL function may call one whose file
comes later. A step that calls a function while it runs (a backfill, a trigger it creates) names
it in a header, `-- functions: nq_a, nq_b`, and gets today's text of each at its start, in its
transaction. With a `target` (a test filling the schema up to a step) the function files are not
applied: they are written for the last step's schema. A change of a function's signature or
meaning takes a new name beside the old (`_v2`): the previous release's processes, still running
during the roll-out, keep calling the old one, which a contract step drops (docs/upgrading.md).

Phases. `migrate` runs before the roll-out, while the previous release serves, so it applies
expand steps only (what the previous release's code keeps working with). A contract step (a
rename's or drop's destructive half) is applied by `migrate --contract`, which refuses while a
process of an older release is connected. A database with no schema yet gets every step at once:
nothing old runs against it.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import re
from collections.abc import Awaitable, Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from typing import Any

import psycopg

from notify_queue import __version__, limits
from notify_queue.errors import ContractStepWaits, DatabaseBusy, OlderReleaseRunning
from notify_queue.repositories import index_steps
from notify_queue.repositories.db import Connection, Database
from notify_queue.repositories.engine import citus_worker_nodes
from notify_queue.repositories.queries import expand_fragments

log = logging.getLogger(__name__)

MIGRATIONS_PACKAGE = "notify_queue.repositories.migrations"
# The schema's functions, one source file each (or one group of a rule's functions): defined again
# by every `migrate` after the migrations, in file-name order (module docstring, "Functions").
FUNCTIONS_FOLDER = "functions"
# The distributed layout, run after the migrations on a Citus coordinator with worker nodes.
CITUS_LAYOUT = "citus/layout.sql"
# The drain's per-bucket functions, delegated to the node that holds the bucket (Citus only).
CITUS_FUNCTIONS = "citus/functions.sql"
# 0.1.0's last migration: the versions recorded where 0.1.0 looks (see the module docstring).
BASELINE_VERSION = 8
# A migration's lock waits, and how often it is tried again after losing one (module docstring).
LOCK_TIMEOUT = "2s"
LOCK_ATTEMPTS = 30
_LOCK_BACKOFF_SECONDS = (0.2, 3.0)  # the first pause and the longest
# An arbitrary constant that identifies "Notify Queue is migrating" among advisory locks, and how
# often a migrator asks for it while another holds it (`_lock`).
_MIGRATION_LOCK_KEY = 7_305_826_031
_LOCK_POLL_SECONDS = 0.2
# The SQLSTATE a step raises when what it depends on is not done yet (ContractStepWaits).
_STEP_WAITS = "NQW01"
_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")
# The phase header: a comment line of its own among the file's leading comment lines.
_PHASE = re.compile(r"^--\s*phase:\s*(\S+)\s*$")
# The transaction header: `-- transaction: none` runs the step outside a transaction.
_TRANSACTION = re.compile(r"^--\s*transaction:\s*(\S+)\s*$")
# The functions header: the functions a step calls while it runs, defined at its start.
_FUNCTIONS = re.compile(r"^--\s*functions:(.*)$")
# How a process of 0.2.0 or later names its connections: `<role>@<release>` (Database).
_RELEASE = re.compile(r"@(\d+)\.(\d+)\.(\d+)")


class Phase(StrEnum):
    EXPAND = "expand"
    CONTRACT = "contract"


@dataclass(frozen=True)
class EnqueueDefaults:
    """What notify_queue_enqueue takes from the deployment's configuration (0045), as `migrate`
    was given it: None (and `webhook_url_given` false) keeps what the database has."""

    max_attempts: int | None = None
    webhook_url: str | None = None
    webhook_url_given: bool = False

    @classmethod
    def configured(
        cls, *, max_attempts: int, webhook_url: str | None, given: AbstractSet[str]
    ) -> EnqueueDefaults:
        """From a role's settings: only what was configured (`given`, the settings' fields set
        by a flag or a variable), so a `migrate` without them keeps the database's values."""
        return cls(
            max_attempts=max_attempts if "max_attempts" in given else None,
            webhook_url=webhook_url,
            webhook_url_given="webhook_url" in given,
        )


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    script: str
    phase: Phase = Phase.EXPAND
    # A step outside a transaction: its index builds, (index name, statement), in file order.
    # Empty for a step that runs in one transaction with its record.
    concurrent_indexes: tuple[tuple[str, str], ...] = ()
    # The functions the step calls while it runs (`-- functions:`), defined at its start.
    functions: tuple[str, ...] = ()


def _header(script: str, pattern: re.Pattern[str]) -> str | None:
    """The value of a `-- key: value` header among the file's leading comment lines."""
    for line in script.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("--"):
            break
        match = pattern.match(stripped)
        if match:
            return match[1]
    return None


def _phase_of(script: str, filename: str) -> Phase:
    """The `-- phase: expand|contract` header; expand by default."""
    value = _header(script, _PHASE)
    try:
        return Phase(value or Phase.EXPAND)
    except ValueError:
        raise ValueError(f"{filename}: unknown phase {value!r}") from None


def _concurrent_indexes_of(script: str, filename: str) -> tuple[tuple[str, str], ...]:
    """A `-- transaction: none` step's index builds (index_steps); () for any other step."""
    value = _header(script, _TRANSACTION)
    if value is None:
        return ()
    if value != "none":
        raise ValueError(f"{filename}: unknown transaction header {value!r} (only `none`)")
    return index_steps.concurrent_indexes(script, filename)


def _functions_of(script: str, filename: str, concurrent: bool) -> tuple[str, ...]:
    """A step's `-- functions: a, b` header: each must name a file of `functions/`."""
    value = _header(script, _FUNCTIONS)
    if value is None:
        return ()
    names = tuple(name.strip() for name in value.split(","))
    unknown = [name for name in names if name not in function_sources()]
    if unknown:
        raise ValueError(f"{filename}: no functions/<name>.sql for {', '.join(unknown)}")
    if concurrent:
        raise ValueError(f"{filename}: a `transaction: none` step cannot define functions")
    return names


def available_migrations(package: str = MIGRATIONS_PACKAGE) -> list[Migration]:
    return list(_read_migrations(package))


@functools.cache
def _read_migrations(package: str) -> tuple[Migration, ...]:
    # Read once per process: readiness asks on every probe, and the files never change under it.
    found = []
    for entry in resources.files(package).iterdir():
        match = _FILE.match(entry.name)
        if match:
            script = entry.read_text(encoding="utf-8")
            version = int(match[1])
            phase = _phase_of(script, entry.name)
            if phase is Phase.CONTRACT and version <= BASELINE_VERSION:
                raise ValueError(f"{entry.name}: the baseline has no contract steps")
            indexes = _concurrent_indexes_of(script, entry.name)
            functions = _functions_of(script, entry.name, bool(indexes))
            found.append(Migration(version, match[2], script, phase, indexes, functions))
    return tuple(sorted(found, key=lambda m: m.version))


def latest_version(package: str = MIGRATIONS_PACKAGE) -> int:
    return available_migrations(package)[-1].version


def release_of(application_name: str) -> tuple[int, int, int]:
    """The release a connection's application name carries; (0, 1, 0) when it carries none:
    0.1.0 named its connections after the role only."""
    match = _RELEASE.search(application_name)
    if match is None:
        return (0, 1, 0)
    return (int(match[1]), int(match[2]), int(match[3]))


def _this_release() -> tuple[int, int, int]:
    return release_of("@" + __version__)


async def older_processes(db: Database | Connection) -> dict[str, int]:
    """Connections (count by application name) of Notify Queue processes of a release older
    than this program's, other than the caller's own."""
    rows = await db.fetch_all("migration_processes_connected")
    mine = _this_release()
    return {
        r["application_name"]: int(r["connections"])
        for r in rows
        if release_of(r["application_name"]) < mine
    }


async def migrate(
    db: Database,
    *,
    target: int | None = None,
    contract: bool = False,
    package: str = MIGRATIONS_PACKAGE,
    enqueue_defaults: EnqueueDefaults | None = None,
) -> list[int]:
    """Apply every pending expand step (up to `target`, if given: the tests of a migration fill
    the schema before it); with `contract`, the contract steps too, once no process of an older
    release is connected (else `OlderReleaseRunning`, and nothing is applied). A database without
    a schema gets every step. Then the application's roles and their rights, and the enqueue
    function's defaults. Returns the versions applied by this call."""
    applied_now: list[int] = []
    async with db.connection() as conn:
        await _lock(conn)
        try:
            await conn.execute("migration_ledgers_create")
            done = {row["version"] for row in await conn.fetch_all("migration_versions")}
            fresh = not done
            pending = [
                m
                for m in available_migrations(package)
                if m.version not in done and (target is None or m.version <= target)
            ]
            contracting = fresh or contract
            # Checked even with no contract step pending, so a post-roll-out job that runs
            # `migrate --contract` until it succeeds also learns that the roll-out is over.
            if contract and not fresh:
                older = await older_processes(conn)
                if older:
                    raise OlderReleaseRunning(
                        "contract steps wait until no process of an older release is connected; "
                        "still connected: "
                        + ", ".join(f"{name} ({n})" for name, n in older.items())
                    )
            for migration in pending:
                if migration.phase is Phase.CONTRACT and not contracting:
                    continue
                await _apply(conn, migration)
                log.debug(
                    "applied migration %04d_%s (%s)",
                    migration.version,
                    migration.name,
                    migration.phase,
                )
                applied_now.append(migration.version)
            if applied_now:
                # One line at INFO however many steps ran (a fresh database takes them all);
                # each step is logged at DEBUG.
                log.info(
                    "migrations applied: %d (%04d to %04d)",
                    len(applied_now),
                    applied_now[0],
                    applied_now[-1],
                )
            # The function files are written for the shipped steps' schema, at their last step.
            if target is None and package == MIGRATIONS_PACKAGE:
                await _define_functions(conn, changed_schema=bool(applied_now))
            await _enqueue_role(conn)
            await _runtime_role(conn)
            await _enqueue_defaults(conn, enqueue_defaults or EnqueueDefaults())
            waiting = [m for m in pending if m.version not in applied_now]
            if not waiting and target is None:
                await _lay_out(conn)
            if waiting:
                log.warning(
                    "%d contract step(s) wait for `notify-queue migrate --contract` once the "
                    "roll-out is done: %s",
                    len(waiting),
                    ", ".join(f"{m.version:04d}_{m.name}" for m in waiting),
                )
        finally:
            await conn.execute("migration_unlock", {"key": _MIGRATION_LOCK_KEY})
    return applied_now


async def _lock(conn: Connection) -> None:
    """Take the migrators' advisory lock, polling while another migrator holds it: a statement
    blocked on the lock would keep its snapshot, which the holder's CREATE INDEX CONCURRENTLY
    waits for (a deadlock between the two)."""
    while True:
        row = await conn.fetch_one("migration_lock", {"key": _MIGRATION_LOCK_KEY})
        if row is not None and row["locked"]:
            return
        await asyncio.sleep(_LOCK_POLL_SECONDS)


async def _apply(conn: Connection, migration: Migration) -> None:
    """One migration and its record in one transaction (or its concurrent index builds, then its
    record), run again while it loses its locks to the running processes' transactions (module
    docstring)."""
    pause, longest = _LOCK_BACKOFF_SECONDS
    for attempt in range(1, LOCK_ATTEMPTS + 1):
        try:
            if migration.concurrent_indexes:
                label = f"{migration.version:04d}_{migration.name}"
                await index_steps.build(conn, label, migration.concurrent_indexes)
                async with conn.transaction():
                    await _record(conn, migration)
            else:
                async with conn.transaction():
                    await conn.execute("migration_lock_timeout", {"timeout": LOCK_TIMEOUT})
                    if migration.functions:
                        await conn.execute("migration_function_bodies_unchecked")
                        sources = function_sources()
                        await conn.execute_script(
                            "\n".join(sources[name] for name in migration.functions)
                        )
                    if _statements_in(migration.script):
                        await conn.execute_script(migration.script)
                    await _record(conn, migration)
            return
        except psycopg.Error as exc:
            if exc.sqlstate == _STEP_WAITS and exc.diag.message_primary:
                raise ContractStepWaits(
                    f"{migration.version:04d}_{migration.name}: {exc.diag.message_primary}"
                ) from None
            raise
        except DatabaseBusy as exc:
            if attempt == LOCK_ATTEMPTS:
                raise
            log.warning(
                "migration %04d_%s rolled back (%s): running processes hold its tables; "
                "attempt %d of %d in %.1f s",
                migration.version,
                migration.name,
                exc,
                attempt + 1,
                LOCK_ATTEMPTS,
                pause,
            )
            await asyncio.sleep(pause)
            pause = min(pause * 2, longest)


async def _define_functions(conn: Connection, *, changed_schema: bool) -> None:
    """Every function from its source (module docstring, "Functions"), in one transaction: a
    process calls either all of the old definitions or all of the new. Skipped when the text is
    the one applied last and no step ran since."""
    script = "\n".join(function_sources().values())
    if not script:
        return
    digest = hashlib.sha256(script.encode()).hexdigest()
    if not changed_schema:
        row = await conn.fetch_one("migration_functions_digest")
        if row is not None and row["digest"] == digest:
            return
    async with conn.transaction():
        await conn.execute("migration_lock_timeout", {"timeout": LOCK_TIMEOUT})
        await conn.execute("migration_function_bodies_unchecked")
        await conn.execute_script(script)
        await conn.execute("migration_functions_digest_set", {"digest": digest})


@functools.cache
def function_sources() -> dict[str, str]:
    """Each function's file by name (`functions/<name>.sql`), in name order, as `migrate` applies
    it: the SQL files' fragments (`{{_name}}`) and the validation limits (`{{limit:NAME}}`) in
    place."""
    folder = resources.files("notify_queue.repositories").joinpath(FUNCTIONS_FOLDER)
    files = sorted((e for e in folder.iterdir() if e.name.endswith(".sql")), key=lambda e: e.name)
    texts = {e.name.removesuffix(".sql"): render_function(e.read_text("utf-8")) for e in files}
    return {name: texts[name] for name in _callees_first(texts)}


def _callees_first(texts: dict[str, str]) -> list[str]:
    """The names in name order, but each after the functions its text names: a SQL function
    with a standard body (`RETURN …`, `BEGIN ATOMIC`) is parsed when it is defined, whatever
    `check_function_bodies` says. A cycle (PL/pgSQL only, bound late) keeps name order."""
    calls = {
        name: {other for other in texts if other != name and re.search(rf"\b{other}\(", text)}
        for name, text in texts.items()
    }
    ordered: list[str] = []
    left = list(texts)
    while left:
        ready = next((n for n in left if calls[n] <= set(ordered)), left[0])
        ordered.append(ready)
        left.remove(ready)
    return ordered


def render_function(text: str) -> str:
    """A function file's text with its placeholders filled: `{{_name}}` a fragment of the SQL
    files, `{{limit:NAME}}` a value of notify_queue.limits (a number as digits, a text or a
    pattern's source as the inside of a SQL string literal, a tuple of texts as a list of SQL
    literals)."""
    return _LIMIT.sub(lambda m: _limit_sql(m[1]), expand_fragments(text))


_LIMIT = re.compile(r"\{\{limit:(\w+)\}\}")


def _limit_sql(name: str) -> str:
    value = getattr(limits, name)
    if isinstance(value, bool) or not isinstance(value, int | str | re.Pattern | tuple):
        raise ValueError(f"limit {name}: {value!r} has no SQL form")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, tuple):
        return ", ".join("'" + str(item).replace("'", "''") + "'" for item in value)
    text = value.pattern if isinstance(value, re.Pattern) else value
    return str(text).replace("'", "''")


def _statements_in(script: str) -> bool:
    """Whether a step has a statement: a step whose function change moved to `functions/` may be
    comments only, which PostgreSQL answers as an empty query."""
    return any(line.strip() and not line.strip().startswith("--") for line in script.splitlines())


async def _lay_out(conn: Connection) -> None:
    """On a Citus coordinator with worker nodes, distribute what is not distributed yet
    (`citus/layout.sql`: each table is skipped once pg_dist_partition has it, so a second
    `migrate` changes nothing). Runs once no step waits: the contract steps drop the triggers
    Citus refuses on distributed tables. On plain PostgreSQL, nothing."""
    workers = await citus_worker_nodes(conn)
    if not workers:
        return
    layout, functions = _read_layout()
    async with conn.transaction():
        await conn.execute_script(layout)
    # Its own transaction: create_distributed_function after the tables are distributed.
    async with conn.transaction():
        await conn.execute_script(functions)
    log.info("distributed layout checked on Citus (%d worker nodes)", workers)


@functools.cache
def _read_layout() -> tuple[str, str]:
    """The layout, and the delegated functions with the SQL files' fragments (`{{_name}}`) in
    place: a function body shares them with the plain statement it stands for."""
    files = resources.files("notify_queue.repositories")
    return (
        files.joinpath(CITUS_LAYOUT).read_text("utf-8"),
        expand_fragments(files.joinpath(CITUS_FUNCTIONS).read_text("utf-8")),
    )


ENQUEUE_ROLE = "notify_queue_enqueue"
RUNTIME_ROLE = "notify_queue_runtime"


async def _enqueue_role(conn: Connection) -> None:
    """The role `notify_queue_enqueue` (NOLOGIN), allowed to execute notify_queue_enqueue and
    nothing else of the schema (docs/enqueue.md). Created when missing if this user may create
    roles; otherwise migrate says so in one line and goes on: the schema is complete without it,
    and an administrator can create it (`CREATE ROLE notify_queue_enqueue NOLOGIN`) and migrate
    again, or grant EXECUTE on the function to a role of their own."""
    state = await conn.fetch_one("migration_enqueue_role_state")
    if state is None or not state["function_present"]:
        return
    await _role(
        conn,
        ENQUEUE_ROLE,
        state,
        create=lambda: conn.execute("migration_enqueue_role_create"),
        grant=lambda: conn.execute("migration_enqueue_role_grant"),
    )


async def _runtime_role(conn: Connection) -> None:
    """The role `notify_queue_runtime` (NOLOGIN), with data rights on the schema and no more,
    for the API, workers, relay and operator (docs/operations.md, "Database roles"). Created
    when missing if this user may create roles, as `notify_queue_enqueue` is; its rights are
    granted again on every run, so what a migration added is covered."""
    state = await conn.fetch_one("migration_runtime_role_state")
    if state is None:
        return
    await _role(
        conn,
        RUNTIME_ROLE,
        state,
        create=lambda: conn.execute("migration_runtime_role_create"),
        grant=lambda: conn.execute("migration_runtime_role_grant"),
    )


async def _role(
    conn: Connection,
    role: str,
    state: dict[str, Any],
    *,
    create: Callable[[], Awaitable[int]],
    grant: Callable[[], Awaitable[int]],
) -> None:
    """An application role created when missing (if this user may), then granted its rights;
    `create` and `grant` run the role's two statements."""
    if not state["present"]:
        if not state["can_create"]:
            log.warning(
                "role %s not created: the migrating user lacks CREATEROLE (create it as an "
                "administrator: CREATE ROLE %s NOLOGIN, then run migrate again)",
                role,
                role,
            )
            return
        try:
            async with conn.transaction():
                await create()
        except (psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
            pass  # a migrator of another database on this server created it just now
        log.info("created role %s", role)
    async with conn.transaction():
        await grant()


async def _enqueue_defaults(conn: Connection, defaults: EnqueueDefaults) -> None:
    """Write what this `migrate` was configured with where notify_queue_enqueue reads it
    (nq_enqueue_defaults, 0045), once that table exists."""
    present = await conn.fetch_one("migration_enqueue_defaults_present")
    if present is None or not present["present"]:
        return
    async with conn.transaction():
        await conn.execute(
            "migration_enqueue_defaults_set",
            {
                "max_attempts": defaults.max_attempts,
                "set_webhook_url": defaults.webhook_url_given,
                "webhook_url": defaults.webhook_url,
            },
        )


async def _record(conn: Connection, migration: Migration) -> None:
    if migration.version <= BASELINE_VERSION:
        await conn.execute(
            "migration_record", {"version": migration.version, "name": migration.name}
        )
    else:
        await conn.execute(
            "migration_step_record",
            {
                "version": migration.version,
                "name": migration.name,
                "phase": str(migration.phase),
                "release": __version__,
            },
        )


async def current_version(db: Database) -> int | None:
    """The newest applied version, baseline or step, or None when the schema was never created."""
    async with db.connection() as conn:
        present = await conn.fetch_one("migration_table_exists")
        if not present or not present["present"]:
            return None
        if present["steps_present"]:
            versions = [r["version"] for r in await conn.fetch_all("migration_versions")]
            return max(versions, default=None)
        row = await conn.fetch_one("migration_current")
    return None if row is None else row["version"]


async def missing_steps(db: Database, *, package: str = MIGRATIONS_PACKAGE) -> list[str]:
    """What this program needs and the database lacks: the baseline and every expand step it
    ships (contract steps never: the code of their release works before and after them). Steps
    newer than this program are fine, so its processes stay ready while the next release's
    `migrate` runs."""
    needed = [m for m in available_migrations(package) if m.phase is Phase.EXPAND]
    async with db.connection() as conn:
        present = await conn.fetch_one("migration_table_exists")
        if not present or not present["present"]:
            return [f"{m.version:04d}_{m.name}" for m in needed]
        baseline = await conn.fetch_one("migration_current")
        steps = await conn.fetch_all("migration_steps_applied") if present["steps_present"] else []
        applied = {r["version"] for r in steps}
    at = (baseline or {}).get("version") or 0
    return [
        f"{m.version:04d}_{m.name}"
        for m in needed
        if (m.version <= BASELINE_VERSION and m.version > at)
        or (m.version > BASELINE_VERSION and m.version not in applied)
    ]
