"""A worker's view of the shared circuits, against the real rows.

A refresh (before every claim) may land while a delivery is asking for the probe. The view must
come out of that with no probe request marked in flight, or the worker would skip the provider
forever without ever asking again (found by the soak: both circuits stayed open after an outage,
every notification deferred, no probe taken).
"""

from __future__ import annotations

import asyncio
import uuid

from notify_queue.models import Outcome
from notify_queue.repositories.db import Database
from notify_queue.repositories.providers import CircuitReport, ProviderRepository
from notify_queue.worker.circuits import Circuits


class SlowProbe(ProviderRepository):
    """The real repository, holding a probe request until the test lets it go."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.asked = asyncio.Event()
        self.answer = asyncio.Event()

    async def provider_circuit_take_probe(
        self, *, provider: str, probe_seconds: float
    ) -> uuid.UUID | None:
        self.asked.set()
        await self.answer.wait()
        return await super().provider_circuit_take_probe(
            provider=provider, probe_seconds=probe_seconds
        )


async def test_a_refresh_during_a_probe_request_leaves_no_probe_marked_in_flight(
    db: Database,
) -> None:
    repository = ProviderRepository(db)
    await repository.provider_rows_ensure(limited=[], breakers=["p"])
    # Open, with a cool-down of zero: the next caller may take the probe.
    await repository.provider_circuits_record(
        reports=[CircuitReport("p", False, 1, threshold=1, open_for_seconds=0.0)]
    )
    slow = SlowProbe(db)
    circuits = Circuits(slow, {"p": (1, 0.0, 60.0)})
    await circuits.refresh()
    asking = asyncio.create_task(circuits.gate("p"))
    await slow.asked.wait()
    await circuits.refresh()  # lands while the probe request is in flight
    slow.answer.set()
    may_call, token, _ = await asking
    assert may_call and token is not None
    # The probe fails: open again, cool-down zero, so the next call may probe again at once.
    circuits.observe("p", Outcome.TEMPORARY_FAILURE, token)
    await circuits.flush()
    may_call, token, _ = await circuits.gate("p")
    assert may_call and token is not None
