"""Processes of two releases side by side, and a client that creates notifications without pause.

`Release` starts `notify-queue <role>` from one release's interpreter (the baseline's virtualenv,
or this checkout's), each process in its own process group with its log in a file. `CreateLoad`
is the API's traffic during an upgrade: a few concurrent clients creating notifications one after
another against whichever API `target` names at that moment, counting every answer that is not a
201 (a refused connection, a 503, a 500) as a failed create.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx


class Release:
    """`notify-queue` of one release: `python -m notify_queue` with that release's interpreter."""

    def __init__(self, name: str, python: Path | str, database_url: str, log_dir: Path) -> None:
        self.name = name
        self.python = str(python)
        self.database_url = database_url
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: dict[int, Path] = {}

    def _env(self) -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if not k.startswith("NOTIFY_QUEUE_")}

    def run(self, role: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run a command that ends (`migrate`) and return how it went."""
        return subprocess.run(
            [self.python, "-m", "notify_queue", role, "--database-url", self.database_url, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self._env(),
        )

    def start(
        self, role: str, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log_path = self.log_dir / f"{self.name}-{role}-{len(self._logs)}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [
                    self.python,
                    "-m",
                    "notify_queue",
                    role,
                    "--database-url",
                    self.database_url,
                    *args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**self._env(), **(env or {})},
                start_new_session=True,
            )
        self.procs.append(proc)
        self._logs[proc.pid] = log_path
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return self._logs[proc.pid].read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-4000:]}"
            for path in self._logs.values()
        )

    async def stop(self, proc: subprocess.Popen[bytes], timeout: float = 60) -> int:
        """SIGTERM, as Kubernetes stops a pod, and wait for the process to exit."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.name} pid {proc.pid} ignored SIGTERM:\n{self.log(proc)}"
                )
            await asyncio.sleep(0.1)
        return proc.returncode

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


async def wait_ready(url: str, proc: subprocess.Popen[bytes], release: Release) -> None:
    """Poll an API's /readyz until it answers 200 (generous deadline: a loaded 2-core machine)."""
    deadline = time.monotonic() + 60
    async with httpx.AsyncClient(timeout=5) as http:
        while True:
            assert proc.poll() is None, f"{release.name} API exited:\n{release.log(proc)}"
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(url + "/readyz")).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise AssertionError(f"{release.name} API not ready:\n{release.log(proc)}")
            await asyncio.sleep(0.2)


async def wait_logged(proc: subprocess.Popen[bytes], release: Release, text: str) -> None:
    deadline = time.monotonic() + 60
    while text not in release.log(proc):
        assert proc.poll() is None, f"{release.name} exited:\n{release.log(proc)}"
        if time.monotonic() > deadline:
            raise AssertionError(f"{release.name}: no {text!r} in:\n{release.log(proc)}")
        await asyncio.sleep(0.1)


@dataclass
class CreateLoad:
    """Concurrent clients creating notifications one after another against `target`; with
    `recipients`, every second create targets one of them by `recipientId` (the previous
    release reads stored recipients in server-prepared statements, which a schema change must
    not break)."""

    target: str
    recipients: list[str] = field(default_factory=list)
    clients: int = 3
    pause_seconds: float = 0.02
    created: list[uuid.UUID] = field(default_factory=list)
    created_by_phase: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    phase: str = "before"
    longest_gap_seconds: float = 0.0
    longest_create_seconds: dict[str, float] = field(default_factory=dict)  # by phase
    in_flight: Counter[str] = field(default_factory=Counter)  # requests under way, by target
    _last_success: float = 0.0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        self._last_success = time.monotonic()
        self._tasks = [asyncio.create_task(self._client(i)) for i in range(self.clients)]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _client(self, number: int) -> None:
        # A new connection per request, as requests through a Service reach whichever pod the
        # endpoints name now: a kept connection to a stopped pod is not what clients see.
        async with httpx.AsyncClient(
            timeout=30, limits=httpx.Limits(max_keepalive_connections=0)
        ) as http:
            sequence = 0
            while not self._stop.is_set():
                sequence += 1
                key = f"upgrade-{number}-{sequence}-{uuid.uuid4().hex[:8]}"
                phase, target = self.phase, self.target
                self.in_flight[target] += 1
                body: dict[str, str] = {
                    "channel": "email",
                    "recipient": f"{key}@example.com",
                    "subject": "upgrade",
                    "body": f"created during the upgrade ({phase})",
                }
                if self.recipients and sequence % 2 == 0:
                    del body["channel"], body["recipient"]
                    body["recipientId"] = self.recipients[sequence % len(self.recipients)]
                began = time.monotonic()
                try:
                    response = await http.post(
                        target + "/notifications", headers={"Idempotency-Key": key}, json=body
                    )
                except httpx.HTTPError as exc:
                    self.failures.append(f"{phase} {target}: {type(exc).__name__}: {exc}")
                else:
                    if response.status_code == 201:
                        answer = response.json()
                        for created in answer.get("notifications", [answer]):
                            self.created.append(uuid.UUID(created["id"]))
                        self.created_by_phase[phase] += 1
                        now = time.monotonic()
                        self.longest_create_seconds[phase] = max(
                            self.longest_create_seconds.get(phase, 0.0), now - began
                        )
                        self.longest_gap_seconds = max(
                            self.longest_gap_seconds, now - self._last_success
                        )
                        self._last_success = now
                    else:
                        self.failures.append(
                            f"{phase} {target}: HTTP {response.status_code} {response.text[:300]}"
                        )
                finally:
                    self.in_flight[target] -= 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.pause_seconds)

    async def drained_from(self, target: str, timeout: float = 60) -> None:
        """Wait until no request to `target` is under way (after `target` moved elsewhere)."""
        deadline = time.monotonic() + timeout
        while self.in_flight[target]:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.in_flight[target]} requests to {target} never ended")
            await asyncio.sleep(0.01)

    async def until(self, phase: str, count: int, timeout: float = 60) -> None:
        """Wait until `count` creates of `phase` succeeded."""
        deadline = time.monotonic() + timeout
        while self.created_by_phase[phase] < count:
            assert not self.failures, self.failures[:5]
            if time.monotonic() > deadline:
                raise AssertionError(f"only {self.created_by_phase[phase]} creates in {phase}")
            await asyncio.sleep(0.05)
