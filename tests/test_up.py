"""`notify-queue up`, the real program, as a newcomer first runs it: it says it is up only once its
API answers, a taken port stops it with one line and no claim to be up, and a first start on an
empty database logs one line for the migrations and drops no delivery log partitions (a new
database has none from before it existed); its worker serves every channel, voice included.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import psycopg
import pytest

from notify_queue.embedded import EmbeddedPostgres
from tests.support import free_port

COMMAND = [sys.executable, "-m", "notify_queue", "up"]
READY = "Notify Queue is up"


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("NOTIFY_QUEUE_")}


@pytest.fixture
def empty_database(pg_server: EmbeddedPostgres) -> Iterator[str]:
    """A database with no schema at all, as `up` meets one the first time."""
    name = "up_first_start"
    with psycopg.connect(pg_server.url(), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name}")
    yield pg_server.url(name)
    with psycopg.connect(pg_server.url(), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


class Up:
    """A running `notify-queue up`, its output collected line by line."""

    def __init__(self, *args: str) -> None:
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [*COMMAND, *args],
            env=_environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, needle: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not any(needle in line for line in self.lines):
            assert self.process.poll() is None, "\n".join(self.lines)
            assert time.monotonic() < deadline, f"no {needle!r}:\n" + "\n".join(self.lines)
            time.sleep(0.05)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGINT)
        code = self.process.wait(timeout=60)
        self._reader.join(timeout=10)
        return code


def test_a_first_start_says_it_is_up_once_the_api_answers_and_logs_no_noise(
    empty_database: str,
) -> None:
    port = free_port()
    # DEBUG, to see the per-step lines move there and to know when retention has run.
    up = Up("--database-url", empty_database, "--port", str(port), "--log-level", "DEBUG")
    try:
        up.wait_for(READY)
        # The moment it says so, the API answers.
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        up.wait_for("delivery log: retention run done")
    finally:
        code = up.stop()
    assert code == 0, "\n".join(up.lines)
    info = [line for line in up.lines if " INFO " in line or " WARNING " in line]
    migrated = [line for line in info if "migration" in line]
    assert len(migrated) == 1, migrated
    assert "migrations applied: " in migrated[0]
    assert not [line for line in up.lines if "dropped nq_delivery_log" in line]
    assert "delivery log: retention run done, 0 partitions dropped" in "\n".join(up.lines)


def test_a_taken_port_stops_up_in_one_line_without_claiming_it_is_up(database_url: str) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = subprocess.run(
            [*COMMAND, "--database-url", database_url, "--port", str(port)],
            env=_environment(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert result.returncode == 1
    assert READY not in result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        f"notify-queue up: cannot listen on 127.0.0.1:{port}: another process has the port; "
        "stop it or choose another with --port (NOTIFY_QUEUE_PORT)"
    ]


def test_up_calls_a_voice_number_sent_through_its_api(empty_database: str) -> None:
    port = free_port()
    up = Up("--database-url", empty_database, "--port", str(port), "--poll-interval", "0.2")
    try:
        up.wait_for(READY)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            call = {"channel": "voice", "recipient": "+4930123456", "body": "db-1 is down"}
            call["idempotencyKey"] = "db-1-down"
            made = http.post("/notifications", json=call)
            assert made.status_code == 201, made.text
            deadline = time.monotonic() + 60
            while (status := http.get(f"/notifications/{made.json()['id']}").json()["status"]) != (
                "SENT"
            ):
                assert status in ("PENDING", "PROCESSING"), status
                assert time.monotonic() < deadline, f"still {status}:\n" + "\n".join(up.lines)
                time.sleep(0.1)
    finally:
        assert up.stop() == 0, "\n".join(up.lines)
