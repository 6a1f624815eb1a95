"""Processes the benchmarks start (workers, the API, the receiver, the peers) and stop again.

Every process is started with its output sent to a log file in the run's work directory and is
stopped by its own pid (SIGTERM, then SIGKILL after a grace period), never by name.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class Proc:
    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        logdir: Path,
        *,
        env: dict[str, str] | None = None,
        stdout_pipe: bool = False,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.log_path = logdir / f"{name}.log"
        self._log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE if stdout_pipe else self._log,
            stderr=self._log,
            env={**os.environ, **(env or {})},
            cwd=cwd or REPO,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace_seconds: float = 10.0) -> int | None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(grace_seconds)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        self._log.close()
        return self.popen.returncode

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def stop_all(procs: Sequence[Proc], grace_seconds: float = 10.0) -> None:
    for p in procs:
        if p.alive():
            p.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    for p in procs:
        p.stop(max(deadline - time.monotonic(), 0.1))


def notify_queue(role: str, args: Sequence[str], logdir: Path, name: str) -> Proc:
    return Proc(name, [sys.executable, "-m", "notify_queue", role, *args], logdir)


class Receiver:
    """The counting webhook receiver, in its own process."""

    def __init__(self, logdir: Path) -> None:
        self.proc = Proc(
            "receiver", [sys.executable, "-m", "benchmarks.receiver"], logdir, stdout_pipe=True
        )
        assert self.proc.popen.stdout is not None
        line = self.proc.popen.stdout.readline().decode().strip()
        if not line:
            raise RuntimeError(f"webhook receiver did not start:\n{self.proc.log_tail()}")
        self.port = int(line)
        self.url = f"http://127.0.0.1:{self.port}/hook"

    def counts(self) -> dict[str, int]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/count", timeout=5) as resp:
            return dict(json.loads(resp.read()))

    def stop(self) -> None:
        self.proc.stop()
