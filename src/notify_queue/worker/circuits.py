"""This worker's view of each provider's circuit breaker, and the outcomes it reports.

The circuits themselves are shared rows that one SQL statement moves (`provider_circuits_record`);
services/circuits.py tallies the outcomes a worker reports to it. What lives here is the worker's
side: a copy of each row in loop time, refreshed after every report, that `gate` reads on every
delivery (closed passes; open is skipped until its cool-down ends; then one delivery among all
workers takes the probe), and the circuit metrics (docs/providers.md, "Circuit breakers").
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime

from notify_queue.errors import DatabaseUnavailable
from notify_queue.models import Outcome
from notify_queue.repositories.providers import CircuitRow, ProviderRepository
from notify_queue.services.circuits import CircuitTally
from notify_queue.worker.metrics import CIRCUIT_STATE, CIRCUIT_TRANSITIONS

log = logging.getLogger(__name__)

_CIRCUIT_CODES = {"closed": 0, "half-open": 1, "open": 2}


@dataclass(slots=True)
class _CircuitView:
    state: str
    open_until: float  # loop time
    probe_until: float  # loop time
    probing: bool = False  # a delivery of this worker is asking for the probe right now


class Circuits:
    """This worker's view of every provider's circuit, and its outcomes to report."""

    def __init__(
        self, repository: ProviderRepository, breakers: dict[str, tuple[int, float, float]]
    ) -> None:
        self._repository = repository
        # name -> (failures threshold, open_for_seconds, probe_seconds)
        self._breakers = breakers
        self._views: dict[str, _CircuitView] = {}
        self._tally = CircuitTally()

    @property
    def enabled(self) -> bool:
        return bool(self._breakers)

    async def refresh(self) -> None:
        if self._breakers:
            self._apply(await self._repository.provider_circuits_read())

    def _apply(self, rows: list[CircuitRow]) -> None:
        now = asyncio.get_running_loop().time()
        for row in rows:
            if row.provider not in self._breakers:
                continue

            def at(moment: datetime | None, clock: datetime = row.clock) -> float:
                return now + (moment - clock).total_seconds() if moment else now

            # Updated in place: a `gate` call may be waiting for the probe on this very view,
            # and its `probing` flag must stay the one it will clear.
            view = self._views.setdefault(row.provider, _CircuitView(row.state, now, now))
            view.state, view.open_until, view.probe_until = (
                row.state,
                at(row.open_until),
                at(row.probe_until),
            )
            CIRCUIT_STATE.labels(row.provider).set(_CIRCUIT_CODES[row.state])

    async def gate(self, name: str) -> tuple[bool, uuid.UUID | None, float]:
        """(may call, probe token if this call is the probe, seconds to wait when it may not)."""
        view = self._views.get(name)
        if name not in self._breakers or view is None or view.state == "closed":
            return True, None, 0.0
        now = asyncio.get_running_loop().time()
        if view.state == "open" and now < view.open_until:
            return False, None, view.open_until - now
        if view.probing or (view.state == "half-open" and now < view.probe_until):
            return False, None, max(view.probe_until - now, 0.5)
        view.probing = True
        try:
            token = await self._repository.provider_circuit_take_probe(
                provider=name, probe_seconds=self._breakers[name][2]
            )
        finally:
            view.probing = False
        view.state = "half-open"
        view.probe_until = now + self._breakers[name][2]
        if token is None:  # another worker probes
            return False, None, 0.5
        log.info("circuit of provider %s half-open: probing with one notification", name)
        return True, token, 0.0

    async def give_back(self, name: str, probe: uuid.UUID) -> None:
        """The delivery that took the probe does not call after all: hand it back now, so
        another delivery (of any worker) probes instead of nobody until the probe times out."""
        view = self._views.get(name)
        if view is not None:
            view.probe_until = asyncio.get_running_loop().time()
        try:
            await self._repository.provider_circuit_return_probe(provider=name, probe_token=probe)
        except DatabaseUnavailable as exc:
            log.warning("handing back the probe of provider %s failed: %s", name, exc)

    def observe(self, name: str, outcome: Outcome, probe: uuid.UUID | None) -> None:
        if name in self._breakers:
            self._tally.observe(name, outcome, probe)

    async def flush(self) -> None:
        if not self._tally:
            return
        reports = self._tally.drain({n: (b[0], b[1]) for n, b in self._breakers.items()})
        try:
            changes = await self._repository.provider_circuits_record(reports=reports)
        except DatabaseUnavailable as exc:
            log.warning("recording circuit outcomes failed: %s", exc)
            return
        for change in changes:
            if change.old_state != change.state:
                log.warning(
                    "circuit of provider %s %s -> %s",
                    change.provider,
                    change.old_state,
                    change.state,
                )
                CIRCUIT_TRANSITIONS.labels(change.provider, change.state).inc()
        await self.refresh()
