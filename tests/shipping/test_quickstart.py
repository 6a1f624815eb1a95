"""docs/quickstart.md works exactly as written, on a machine with no cluster.

Every fenced `sh` block of the quickstart carries a marker saying how this test treats it:
`<!-- quickstart: run -->` blocks run in order, as one shell session would run them (bash with
`set -euo pipefail`; the variables a block exports reach the next); the
`<!-- quickstart: background; ready when it prints "…" -->` block is started in the background
(that is `notify-queue up --kubernetes`) and the next block waits for that line, as the reader
does; `<!-- quickstart: skip; <why> -->` blocks are not run and must say why. The test works in a
fresh copy of the repository, so `python3 -m venv .venv` and `pip install -e .` run for real; at
the end the background process gets Ctrl-C (SIGINT) and must stop cleanly, with nothing it
started left behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from notify_queue.headers import GENERATED_HEADERS_VERIFIED
from tests.shipping.support import ROOT, Tools
from tests.support import directory_outside_pytest

pytestmark = pytest.mark.kubernetes

QUICKSTART = ROOT / "docs" / "quickstart.md"
_BLOCK = re.compile(
    r"<!-- quickstart: (?P<marker>[^>]*?) -->\s*\n```(?P<lang>\w*)\n(?P<code>.*?)\n```", re.S
)
_FENCE = re.compile(r"^```(\w*)$", re.M)


@dataclass(frozen=True)
class Block:
    kind: str  # run, background, skip
    detail: str
    code: str


def blocks() -> list[Block]:
    text = QUICKSTART.read_text()
    found = []
    for match in _BLOCK.finditer(text):
        kind, _, detail = match["marker"].partition(";")
        assert match["lang"] == "sh", f"quickstart blocks are sh: {match['code'][:60]}"
        found.append(Block(kind.strip(), detail.strip(), match["code"]))
    return found


def test_every_shell_block_of_the_quickstart_says_how_the_test_runs_it() -> None:
    fences = [m for m in _FENCE.finditer(QUICKSTART.read_text()) if m[1] == "sh"]
    found = blocks()
    assert len(found) == len(fences), "an sh block without a <!-- quickstart: ... --> marker"
    for block in found:
        assert block.kind in {"run", "background", "skip"}, block.kind
        if block.kind == "skip":
            assert block.detail, "a skipped block must say why"
    assert [b.kind for b in found].count("background") == 1


def _checkout_copy(destination: Path) -> None:
    """The repository's files as a fresh clone would have them (plus work not committed yet)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def _environment() -> dict[str, str]:
    """This machine's environment, minus the test run's own virtualenv (the reader has none)."""
    venv = str(ROOT / ".venv")
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "KUBECONFIG")
    }
    env["PATH"] = os.pathsep.join(
        p for p in env["PATH"].split(os.pathsep) if not p.startswith(venv)
    )
    env.pop("NOTIFY_QUEUE_DATABASE_URL", None)
    return env


class Background:
    """The background block's process, its output collected, waited for by a line."""

    def __init__(self, code: str, cwd: Path, env: dict[str, str], state: Path) -> None:
        self.output: list[str] = []
        self.process = subprocess.Popen(
            ["bash", "-c", f"set -euo pipefail; source {state}; exec {code}"],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)

    def wait_for(self, needle: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(needle in line for line in self.output):
            if self.process.poll() is not None:
                raise AssertionError(
                    f"exited {self.process.returncode} before {needle!r}:\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"no {needle!r} within {timeout}s:\n{self.tail()}")
            time.sleep(0.2)

    def interrupt(self, timeout: float = 60) -> int:
        """Ctrl-C, as the reader stops it; a process group that does not stop is killed."""
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            raise AssertionError(
                f"did not stop on Ctrl-C within {timeout}s:\n{self.tail()}"
            ) from None
        finally:
            self._reader.join(timeout=10)

    def tail(self, lines: int = 40) -> str:
        return "".join(self.output[-lines:])


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_the_quickstart_runs_as_written_on_a_machine_with_no_cluster(
    tools: Tools, tmp_path: Path
) -> None:
    # Port 8080 is the quickstart's, as written: a second suite on the machine waits for this one
    # (a check that the port is free, then a bind, raced between two suites and both failed).
    with open(Path(tempfile.gettempdir()) / "notify-queue-quickstart.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _the_quickstart_alone(tmp_path)


def _the_quickstart_alone(tmp_path: Path) -> None:
    if not _port_free(8080):
        pytest.skip("the quickstart uses port 8080, which another process holds")
    # The copy's virtualenv holds the embedded PostgreSQL that `up` runs as its own user:
    # outside pytest's temp (tests/support.py, directory_outside_pytest).
    with directory_outside_pytest("notify-queue-quickstart-") as root:
        checkout = root / "notify-queue"
        _checkout_copy(checkout)
        _run_the_quickstart(checkout, tmp_path)


def _run_the_quickstart(checkout: Path, tmp_path: Path) -> None:
    env = _environment()
    state = tmp_path / "shell-state.sh"
    state.write_text("")
    background: Background | None = None
    try:
        for block in blocks():
            if block.kind == "skip":
                continue
            if block.kind == "background":
                background = Background(block.code, checkout, env, state)
                needle = re.search(r'ready when it prints "([^"]+)"', block.detail)
                assert needle, "the background block must say which line means it is ready"
                background.wait_for(needle[1], timeout=180)
                continue
            script = f"set -euo pipefail\nsource {state}\n{block.code}\nexport -p > {state}.next\n"
            result = subprocess.run(
                ["bash", "-c", script],
                cwd=checkout,
                env=env,
                capture_output=True,
                text=True,
                timeout=540,
                check=False,
            )
            assert result.returncode == 0, (
                f"quickstart block failed ({result.returncode}):\n{block.code}\n--- stdout\n"
                f"{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}"
                + (f"\n--- notify-queue up\n{background.tail()}" if background else "")
            )
            Path(f"{state}.next").replace(state)
        assert background is not None
        _the_plugin_read_the_api(checkout, env, state)
        code = background.interrupt()
        assert code == 0, f"notify-queue up exited {code} on Ctrl-C:\n{background.tail()}"
        assert "stopped" in background.tail()
        _a_first_start_is_quiet(background.output)
        background = None
    finally:
        if background is not None and background.process.poll() is None:
            # A failed step: stop it the reader's way first, so `up` stops what it started (its
            # cluster runs in sessions of its own, which a kill of its group does not reach).
            with contextlib.suppress(AssertionError):
                background.interrupt(timeout=30)
        stray = _processes_in(checkout)
        for pid in stray:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert not stray, f"processes left running from the quickstart: {stray}"


def _a_first_start_is_quiet(output: list[str]) -> None:
    """A newcomer's first `up --kubernetes` on a new database: one line for the migrations, no
    partition dropped (a new database has none before it existed), no warning from kopf."""
    log = "".join(output)
    assert len(re.findall(r"INFO .*migrations applied: ", log)) == 1, log
    assert "applied migration" not in log
    assert "dropped nq_delivery_log" not in log
    assert "OS signals are ignored" not in log
    warnings = [line for line in output if " WARNING " in line]
    if not GENERATED_HEADERS_VERIFIED:  # this Python's own, said once (docs/security.md)
        warnings = [line for line in warnings if "CVE-2024-6923" not in line]
    assert not warnings, warnings


def _the_plugin_read_the_api(checkout: Path, env: dict[str, str], state: Path) -> None:
    """`kubectl notify` in the reader's shell got its answers from the API, not the lines that
    stand in for them when it cannot reach it (which exit 0 as well)."""

    def plugin(*args: str) -> Any:
        result = subprocess.run(
            ["bash", "-c", f"source {state}; kubectl notify {' '.join(args)} -o json"],
            cwd=checkout,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    why = plugin("why", "bounce")
    assert why["api"] == "ok", why["api"]
    assert why["deliveryAttempts"], why
    assert why["retries"], why  # the quickstart's `kubectl notify retry bounce`
    top = plugin("top")
    assert top["api"] == "ok", top["api"]
    assert top["status"]["counts"], top
    assert set(top["oldestDue"]) == {"HIGH", "NORMAL", "LOW"}, top


def _processes_in(checkout: Path) -> list[int]:
    """Processes started from the copy: run in it, or naming it on their command line."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cwd.startswith(str(checkout)) or str(checkout) in cmdline:
            found.append(int(proc.name))
    return found
