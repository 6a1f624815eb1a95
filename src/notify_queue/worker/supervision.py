"""Supervised background tasks and the health they add up to.

A worker process is a small tree of long-running tasks (claimer, completer, housekeeping,
wake-up listener, webhook relay), the way River's client is a producer, a completer and
maintenance services. None of them may die unobserved: a task that raises is logged with its
traceback, marked failing in `Health` (so `/healthz` answers 503 and Kubernetes' probes see it)
and started again after a backoff that doubles up to `max_backoff_seconds`. A task marks itself
healthy again with `Health.ok` after a round of real work, so a task that fails on every round
stays visibly unhealthy instead of flapping between "restarted" and "failed".

Cancellation is not a failure: stopping the worker cancels the supervisors, which cancel their
tasks and return.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(slots=True)
class TaskHealth:
    healthy: bool = True
    restarts: int = 0
    last_error: str | None = None
    failing_since: float | None = None  # time.monotonic() of the first failure in a row
    rounds: int = 0  # rounds of real work so far (`Health.ok` calls)


class Health:
    """The health of a process's supervised tasks: what `/healthz` reports."""

    def __init__(self) -> None:
        self._tasks: dict[str, TaskHealth] = {}

    def register(self, name: str) -> None:
        self._tasks.setdefault(name, TaskHealth())

    def ok(self, name: str) -> None:
        """`name` just finished a round of real work: it is healthy (cheap; call it freely)."""
        task = self._tasks.get(name)
        if task is None:
            return
        task.rounds += 1
        if not task.healthy:
            log.info("%s recovered after %d restarts", name, task.restarts)
            task.healthy = True
            task.failing_since = None

    def failed(self, name: str, error: BaseException) -> None:
        task = self._tasks.setdefault(name, TaskHealth())
        task.restarts += 1
        task.last_error = f"{type(error).__name__}: {error}"[:500]
        if task.healthy:
            task.healthy = False
            task.failing_since = time.monotonic()

    def has_worked(self, name: str) -> bool:
        """`name` has finished at least one round of real work (a test waits for a settled
        process with it)."""
        task = self._tasks.get(name)
        return task is not None and task.rounds > 0

    def is_healthy(self, name: str) -> bool:
        task = self._tasks.get(name)
        return task is None or task.healthy

    @property
    def healthy(self) -> bool:
        return all(t.healthy for t in self._tasks.values())

    def report(self) -> dict[str, object]:
        return {
            "healthy": self.healthy,
            "tasks": {
                name: {
                    "healthy": t.healthy,
                    "restarts": t.restarts,
                    "lastError": t.last_error,
                    "failingForSeconds": (
                        None
                        if t.failing_since is None
                        else round(time.monotonic() - t.failing_since, 1)
                    ),
                }
                for name, t in sorted(self._tasks.items())
            },
        }


async def supervise(
    name: str,
    run: Callable[[], Awaitable[None]],
    health: Health,
    *,
    stop: asyncio.Event,
    first_backoff_seconds: float = 0.5,
    max_backoff_seconds: float = 30.0,
) -> None:
    """Run `run()` until `stop` is set, restarting it with backoff whenever it raises.

    A `run` that returns while `stop` is not set is restarted too: these tasks are meant to run
    for the life of the process, so returning early is a bug worth seeing in the log.
    """
    health.register(name)
    backoff = first_backoff_seconds
    while not stop.is_set():
        started = time.monotonic()
        try:
            await run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("%s failed; restarting in %.1fs", name, backoff)
            health.failed(name, exc)
        else:
            if stop.is_set():
                return
            log.error("%s returned unexpectedly; restarting in %.1fs", name, backoff)
            health.failed(name, RuntimeError("returned unexpectedly"))
        # A task that ran a good while before failing starts its backoff over.
        if time.monotonic() - started > max_backoff_seconds:
            backoff = first_backoff_seconds
        try:
            await asyncio.wait_for(stop.wait(), timeout=backoff)
        except TimeoutError:
            pass
        backoff = min(backoff * 2, max_backoff_seconds)
