"""The connector seam: the only code that calls psycopg.

`Database` owns one async connection pool per process and offers four calls (execute, fetch one,
fetch all, a transaction) plus LISTEN. Every driver error is translated here, once, into
`DatabaseUnavailable`, so the layers above never see psycopg's exceptions. Statements are
parameterised, always: queries come from `sql/*.sql` and values only ever travel as parameters.

Two URLs. The pool may go through a transaction-mode pooler (PgBouncer), where each transaction
may run on another server connection: nothing the pool runs may outlive its transaction. What
needs one session for longer (LISTEN, a session-level advisory lock held across statements) runs
on a connection of its own to `session_url`, which reaches PostgreSQL directly
(docs/operations.md, "PgBouncer").
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, cast

import psycopg
import psycopg.sql
from psycopg.rows import dict_row, namedtuple_row
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from notify_queue import __version__, jsontext
from notify_queue.errors import DatabaseBusy, DatabaseUnavailable
from notify_queue.models import PoolStats
from notify_queue.repositories.queries import QUERIES

log = logging.getLogger(__name__)

Row = dict[str, Any]
Params = Mapping[str, Any]

# Errors that mean "the database is not there right now", as opposed to a bug in a statement.
_UNAVAILABLE = (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout)
# Rolled back because of other transactions (40001, 40P01, 55P03): DatabaseBusy, which a caller
# may meet by running the transaction again (the migrator does).
_LOST_TO_OTHERS = (psycopg.errors.TransactionRollback, psycopg.errors.LockNotAvailable)

# A connection handed out again within this many seconds of its last use is not checked first.
# The check is a round trip of its own (an empty query); checking on every checkout doubled the
# round trips of a single `POST /notifications`. A connection that was just used worked a moment
# ago; one idle longer (as every connection is after a database restart of any length) is
# checked, and a connection that breaks in between fails its one call (503) and is replaced.
CHECK_IDLE_SECONDS = 1.0


def application_name(role: str) -> str:
    """What a connection is called in pg_stat_activity: its role and this program's release,
    `notify-queue-worker@0.2.0`. `migrate --contract` counts the connections of older releases
    by it (docs/upgrading.md); 0.1.0 named its connections after the role only."""
    return f"{role}@{__version__}"


def _translate(exc: BaseException) -> DatabaseUnavailable:
    # The first line only: libpq's messages can carry the host and port but never the password.
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, _LOST_TO_OTHERS):
        return DatabaseBusy(f"database busy: {first_line}")
    return DatabaseUnavailable(f"database unavailable: {first_line}")


def _json_loads(data: bytes | str) -> Any:
    # jsonb columns (metadata, retries, delivery attempts) by orjson where it reads them exactly
    # (`notify_queue.jsontext`): with the standard library this was a tenth of a batch's cost.
    return jsontext.loads(data if isinstance(data, bytes) else data.encode(), fallback=json.loads)


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    set_json_loads(_json_loads, conn)
    # Times read as UTC datetimes (`datetime.timezone.utc`): psycopg gives a timestamptz the
    # session's time zone, and a server set to 'Etc/UTC' (Debian's default) made every value a
    # ZoneInfo datetime, whose arithmetic asks the zone for its offset each time (several times
    # slower for the worker's due-to-sent observation). Every time this program writes as
    # text is written in UTC explicitly (nq_rfc3339, `AT TIME ZONE 'UTC'`), so only the Python
    # objects change. A SET, not a startup option: PgBouncer passes it on (it tracks TimeZone
    # per client) where it refuses an `options` startup parameter.
    await conn.execute("SET TIME ZONE 'UTC'")


class _MostRecentFirstPool(AsyncConnectionPool[Any]):
    """psycopg_pool hands out its idle connections in turn (the longest idle first). A worker
    runs a handful of statements over and over from two or three tasks at a time; in turn, each
    of its pooled connections planned each statement and filled its catalog caches anew (a
    connection's first claim costs the server far more than the next ones), and each was
    idle long enough to be checked again before use. Handed out most recently returned first,
    the connections a role needs at once stay warm and the others idle at the far end, where the
    pool's own shrinking (`max_idle`) closes them first."""

    async def _get_ready_connection(self, timeout: float | None) -> Any:
        if self._pool and not (timeout is not None and timeout <= 0.0):
            # psycopg_pool's own bookkeeping (_nconns_min: the fewest idle connections since
            # the last shrink) as in its popleft() branch.
            conn = self._pool.pop()
            self._nconns_min = min(self._nconns_min, len(self._pool))
            return conn
        return await super()._get_ready_connection(timeout)


class Database:
    """A pool of connections to one PostgreSQL database."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 8,
        name: str = "notify-queue",
        acquire_timeout_seconds: float = 10.0,
        session_url: str | None = None,
        prepared_statements: bool = True,
    ) -> None:
        self.url = url
        self.session_url = session_url or url
        self._name = name
        self._pool = _MostRecentFirstPool(
            url,
            min_size=1,
            max_size=pool_size,
            open=False,
            # How long a call waits for a connection before DatabaseUnavailable: bounds every call
            # while PostgreSQL is away (the API answers 503 instead of hanging).
            timeout=acquire_timeout_seconds,
            # A connection found broken is replaced, so a restarted PostgreSQL is reconnected to.
            check=self._check_if_idle,
            configure=_configure,
            kwargs={
                "autocommit": True,
                "application_name": application_name(name),
                "row_factory": dict_row,
                # psycopg prepares a statement on the server after its fifth run on a connection
                # (the default threshold); None never does, for poolers that cannot keep them.
                **({} if prepared_statements else {"prepare_threshold": None}),
            },
            reconnect_timeout=float("inf"),
            name=name,
        )
        # When each pooled connection was last given back (monotonic seconds).
        self._returned_at: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], float] = (
            weakref.WeakKeyDictionary()
        )

    async def _check_if_idle(self, conn: psycopg.AsyncConnection[Any]) -> None:
        returned_at = self._returned_at.get(conn)
        if returned_at is None or time.monotonic() - returned_at > CHECK_IDLE_SECONDS:
            await AsyncConnectionPool.check_connection(conn)

    async def open(self, *, wait: bool = True, timeout: float = 10.0) -> None:
        """Open the pool; with `wait`, fail fast with the server's reason if it cannot connect."""
        try:
            if wait:
                # One direct connection first: its error says why ("connection refused",
                # "password authentication failed"), where the pool would only time out.
                conn = await psycopg.AsyncConnection.connect(
                    self.url, connect_timeout=max(int(timeout), 1)
                )
                await conn.close()
            await self._pool.open(wait=wait, timeout=timeout)
        except _UNAVAILABLE as exc:
            await self._pool.close()
            raise _translate(exc) from None

    async def close(self) -> None:
        await self._pool.close()

    def pool_stats(self) -> PoolStats:
        """The pool now (synchronous and cheap: psycopg_pool keeps these counts itself), for the
        roles' `notify_queue_database_pool_*` metrics."""
        stats = self._pool.get_stats()
        return PoolStats(
            max_connections=stats.get("pool_max", self._pool.max_size),
            connections=stats.get("pool_size", 0),
            idle=stats.get("pool_available", 0),
            waiting=stats.get("requests_waiting", 0),
            acquires_total=stats.get("requests_num", 0),
            acquire_wait_seconds_total=stats.get("requests_wait_ms", 0) / 1000,
            acquire_errors_total=stats.get("requests_errors", 0),
            connections_lost_total=stats.get("connections_lost", 0),
        )

    async def __aenter__(self) -> Database:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        """A pooled connection in autocommit mode; `Connection.transaction()` for atomic work."""
        try:
            async with self._pool.connection() as conn:
                try:
                    yield Connection(cast(psycopg.AsyncConnection[Row], conn))
                finally:
                    self._returned_at[conn] = time.monotonic()
        except _UNAVAILABLE as exc:
            raise _translate(exc) from None

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        async with self.connection() as conn, conn.transaction():
            yield conn

    async def execute(self, query: str, params: Params | None = None) -> int:
        async with self.connection() as conn:
            return await conn.execute(query, params)

    async def fetch_one(self, query: str, params: Params | None = None) -> Row | None:
        async with self.connection() as conn:
            return await conn.fetch_one(query, params)

    async def fetch_all(
        self,
        query: str,
        params: Params | None = None,
        *,
        binary: bool = False,
        prepare: bool = False,
    ) -> list[Row]:
        async with self.connection() as conn:
            return await conn.fetch_all(query, params, binary=binary, prepare=prepare)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Connection]:
        """A connection of its own to `session_url`, closed afterwards: for work that holds a
        session-level lock across statements, which a transaction-mode pooler would spread over
        several server connections (the lock taken on one, the unlock sent to another)."""
        try:
            async with await psycopg.AsyncConnection.connect(
                self.session_url,
                autocommit=True,
                application_name=application_name(f"{self._name}-session"),
                row_factory=dict_row,
            ) as conn:
                yield Connection(conn)
        except _UNAVAILABLE as exc:
            raise _translate(exc) from None

    async def listen(
        self,
        channels: tuple[str, ...],
        stop: asyncio.Event,
        *,
        on_state: Callable[[bool], None] | None = None,
    ) -> AsyncIterator[str]:
        """Yield the channel of each NOTIFY on one of `channels` until `stop` is set; reconnects
        on loss. One connection for them all: each LISTEN ties up a session.

        Runs on its own connection to `session_url`, outside the pool: a LISTEN ties up a
        session, which a transaction-mode pooler gives back after each transaction (the
        notifications would then reach whichever client runs there next, or nobody). After a
        reconnect it yields "" (any channel), because hints sent while it was away are lost and
        the caller should look for work anyway. `on_state(True)` is called once the LISTEN is in
        place and `on_state(False)` when the connection is lost (or the listener ends): while it
        is away the caller cannot rely on hints and polls instead.
        """
        delay = 0.1
        while not stop.is_set():
            listening = False
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.session_url,
                    autocommit=True,
                    application_name=application_name("notify-queue-listen"),
                ) as conn:
                    for channel in channels:
                        await conn.execute(f"LISTEN {channel}")  # channels are constants of ours
                    delay = 0.1
                    listening = True
                    if on_state is not None:
                        on_state(True)
                    yield ""
                    while not stop.is_set():
                        async for notify in conn.notifies(timeout=1.0):
                            yield notify.channel
            except _UNAVAILABLE as exc:
                if listening and on_state is not None:
                    listening = False
                    on_state(False)
                log.warning(
                    "listen connection lost (%s); reconnecting in %.1fs", _translate(exc), delay
                )
                try:
                    await asyncio.wait_for(stop.wait(), timeout=delay)
                except TimeoutError:
                    pass
                delay = min(delay * 2, 5.0)


class Connection:
    """One connection, with the same calls as `Database`; statements are named queries."""

    def __init__(self, conn: psycopg.AsyncConnection[Row]) -> None:
        self._conn = conn

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        try:
            async with self._conn.transaction():
                yield self
        except _UNAVAILABLE as exc:
            raise _translate(exc) from None

    async def execute(self, query: str, params: Params | None = None) -> int:
        try:
            cur = await self._conn.execute(_sql(query), params)
        except _UNAVAILABLE as exc:
            raise _translate(exc) from None
        return cur.rowcount

    async def fetch_one(
        self, query: str, params: Params | None = None, *, prepare: bool = False
    ) -> Row | None:
        """`prepare`: prepared on the server at its first run on this connection, not its fifth
        (see `_prepare`)."""
        try:
            cur = await self._conn.execute(_sql(query), params, prepare=self._prepare(prepare))
            return await cur.fetchone()
        except _UNAVAILABLE as exc:
            raise _translate(exc) from None

    async def fetch_all(
        self,
        query: str,
        params: Params | None = None,
        *,
        binary: bool = False,
        prepare: bool = False,
    ) -> list[Row]:
        """Rows as dicts; `binary` reads them in binary, cheaper to decode for wide rows (times,
        uuids, jsonb): a batch create reads back 1,000 whole notifications. `prepare` as in
        `fetch_one`."""
        try:
            cur = await self._conn.execute(
                _sql(query), params, binary=binary, prepare=self._prepare(prepare)
            )
            return await cur.fetchall()
        except _UNAVAILABLE as exc:
            raise _translate(exc) from None

    def _prepare(self, prepare: bool) -> bool | None:
        """True: prepare now, at the statement's first run on this connection (the drain's two
        big statements: parsed once, and PostgreSQL's choice between custom and generic plans
        starts five calls earlier); None: psycopg's threshold (the fifth run) decides. Never True
        on a connection that prepares nothing (`--database-prepared-statements off`, a pooler
        that cannot keep prepared statements)."""
        return True if prepare and self._conn.prepare_threshold is not None else None

    async def fetch_named(
        self, query: str, params: Params | None = None, *, prepare: bool = False
    ) -> list[Any]:
        """Rows as named tuples (`row.id`), read in binary. For the claim: a claimed row is
        35 columns, and a dict of parsed text costs a worker more per notification than a named
        tuple of binary values. `prepare` as in `fetch_one`."""
        try:
            cur = self._conn.cursor(row_factory=namedtuple_row, binary=True)
            await cur.execute(_sql(query), params, prepare=self._prepare(prepare))
            return await cur.fetchall()
        except _UNAVAILABLE as exc:
            raise _translate(exc) from None

    async def execute_on(
        self, query: str, identifiers: dict[str, str], *, catalog: dict[str, str] | None = None
    ) -> None:
        """Run a named query whose `{name}` placeholders are identifiers (a partition to
        detach): statements that take no parameters there. The driver quotes each one.
        `catalog` fills placeholders with SQL text read from the catalog (an index's definition
        from pg_get_indexdef), never input."""
        statement = psycopg.sql.SQL(_sql(query)).format(
            **{k: psycopg.sql.Identifier(v) for k, v in identifiers.items()},
            **{k: psycopg.sql.SQL(v) for k, v in (catalog or {}).items()},
        )
        try:
            await self._conn.execute(statement)
        except _UNAVAILABLE as exc:
            raise _translate(exc) from None

    async def execute_script(self, script: str) -> None:
        """Run a whole SQL file (a migration): several statements, no parameters."""
        try:
            await self._conn.execute(script)
        except _UNAVAILABLE as exc:
            raise _translate(exc) from None


def _sql(name: str) -> str:
    """The named query from `sql/*.sql` (never built from input: values are parameters)."""
    return QUERIES[name]
