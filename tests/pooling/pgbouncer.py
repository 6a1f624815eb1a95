"""A real PgBouncer (Debian's `pgbouncer` package) as a plain process, for the pooling tests.

`PgBouncer` writes an ini for one database in front of the embedded PostgreSQL, in transaction
mode, with clients authenticated by SCRAM against the secret PostgreSQL keeps for the role (read
from pg_authid into the auth_file). It listens on a free loopback port; `admin()` opens its admin
console, whose SHOW commands speak only the simple query protocol (hence `ClientCursor`).
PgBouncer refuses to run as root: as root it drops to the embedded server's own user, which can
reach that server's socket directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from tests.support import free_port


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None
    )


@dataclass
class PgBouncer:
    binary: str
    work_dir: Path
    socket_dir: str  # the embedded PostgreSQL's Unix socket directory
    database: str
    user: str
    password: str
    default_pool_size: int
    run_as: str | None = None
    port: int = 0
    _process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The pooled URL: what --database-url is when a pooler stands in front."""
        return f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/nq"

    def start(self, scram_secret: str) -> None:
        self.port = free_port()
        (self.work_dir / "userlist.txt").write_text(f'"{self.user}" "{scram_secret}"\n')
        ini = f"""
[databases]
nq = host={self.socket_dir} port=5432 dbname={self.database}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = scram-sha-256
auth_file = {self.work_dir / "userlist.txt"}
pool_mode = transaction
default_pool_size = {self.default_pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 500
admin_users = {self.user}
logfile = {self.work_dir / "pgbouncer.log"}
pidfile = {self.work_dir / "pgbouncer.pid"}
{f"user = {self.run_as}" if self.run_as else ""}
"""
        (self.work_dir / "pgbouncer.ini").write_text(ini)
        if self.run_as:
            for path in [self.work_dir, *self.work_dir.iterdir()]:
                shutil.chown(path, user=self.run_as)
        self._stdout = (self.work_dir / "stdout.log").open("wb")
        self._process = subprocess.Popen(
            [self.binary, str(self.work_dir / "pgbouncer.ini")],
            stdout=self._stdout,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while True:
            assert self._process.poll() is None, f"pgbouncer exited:\n{self.log()}"
            try:
                with self.admin() as admin:
                    admin.execute("SHOW VERSION")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def admin(self) -> psycopg.Connection[dict[str, Any]]:
        return psycopg.connect(
            f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/pgbouncer",
            autocommit=True,
            cursor_factory=psycopg.ClientCursor,
            row_factory=dict_row,
        )

    def show(self, what: str) -> list[dict[str, Any]]:
        """`SHOW POOLS`, `SHOW SERVERS`, ... on the admin console, rows of the database `nq`."""
        with self.admin() as admin:
            rows = admin.execute(f"SHOW {what}").fetchall()
        return [r for r in rows if r.get("database") == "nq"]

    def log(self) -> str:
        parts = [self.work_dir / "stdout.log", self.work_dir / "pgbouncer.log"]
        return "\n".join(p.read_text(errors="replace") for p in parts if p.exists())

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._process is not None:
            self._stdout.close()
