"""Circuit-breaker bookkeeping between a worker and the shared circuit rows.

The state machine itself is one SQL statement (`provider_circuits_record`), so every worker moves
the shared row the same way under its row lock. What a worker contributes is a tally of its own
outcomes per provider since its last report: whether any call succeeded and how many failed after
the last success (the current run of failures), plus the result of a probe it held.

What counts as a failure for the breaker: a temporary failure (connection refused, timeout, 429,
5xx). A permanent failure (400, 410: the request or the address is wrong) is an answer from a
working provider and counts as a success.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from notify_queue.models import Outcome
from notify_queue.repositories.providers import CircuitReport


@dataclass(slots=True)
class _Tally:
    had_success: bool = False
    trailing_failures: int = 0
    probe_token: uuid.UUID | None = None
    probe_ok: bool | None = None


@dataclass(slots=True)
class CircuitTally:
    """Outcomes per provider, in the order they happened, until `drain` hands them over."""

    _tallies: dict[str, _Tally] = field(default_factory=dict)

    def observe(self, provider: str, outcome: Outcome, probe_token: uuid.UUID | None) -> None:
        tally = self._tallies.setdefault(provider, _Tally())
        ok = outcome is not Outcome.TEMPORARY_FAILURE
        if ok:
            tally.had_success = True
            tally.trailing_failures = 0
        else:
            tally.trailing_failures += 1
        if probe_token is not None:
            tally.probe_token, tally.probe_ok = probe_token, ok

    def drain(self, breakers: dict[str, tuple[int, float]]) -> list[CircuitReport]:
        """Reports for providers with a breaker (`name -> (failures, open_for_seconds)`)."""
        reports = [
            CircuitReport(
                provider=name,
                had_success=t.had_success,
                trailing_failures=t.trailing_failures,
                threshold=breakers[name][0],
                open_for_seconds=breakers[name][1],
                probe_token=t.probe_token,
                probe_ok=t.probe_ok,
            )
            for name, t in sorted(self._tallies.items())
            if name in breakers
        ]
        self._tallies.clear()
        return reports

    def __bool__(self) -> bool:
        return bool(self._tallies)
