"""Provider state shared through PostgreSQL: the circuit breaker and the send schedule.

The breaker: Hypothesis draws sequences of what workers report (successes, runs of failures,
probe results, with right or stale probe tokens) and of probe requests, runs them against the
real statements (`provider_circuits_record`, `provider_circuit_take_probe`) and checks each step
against a reference model of the state machine: closed opens only when a run reaches the
threshold; an open circuit grants no probe before its cool-down; at most one probe is out at a
time; only the current probe's result moves a half-open circuit.

The schedule: Hypothesis draws reservations (how many slots, from how many workers at once) for
rates and horizons and checks that granted slots never overlap, are spaced one step apart, and
never lie beyond the horizon.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from notify_queue.repositories.db import Database
from notify_queue.repositories.providers import CircuitReport, ProviderRepository
from tests.properties.conftest import Raw, db_settings

THRESHOLD = 3

step = st.one_of(
    st.tuples(st.just("report"), st.booleans(), st.integers(min_value=0, max_value=4)),
    st.tuples(st.just("probe"), st.just(False), st.just(0)),
    st.tuples(st.just("probe_result"), st.booleans(), st.just(0)),
    st.tuples(st.just("stale_probe_result"), st.booleans(), st.just(0)),
)


@dataclass
class Model:
    state: str = "closed"
    failures: int = 0
    probe: uuid.UUID | None = None


@db_settings(60)
@given(steps=st.lists(step, min_size=1, max_size=25), cooled=st.booleans())
async def test_the_shared_circuit_follows_the_breaker_state_machine(
    db: Database, raw: Raw, steps: list[tuple[str, bool, int]], cooled: bool
) -> None:
    """`cooled`: the cool-down is 0 s (a probe may be taken as soon as it opens) or an hour."""
    await raw.conn.execute("TRUNCATE nq_provider_circuits")
    repo = ProviderRepository(db)
    await repo.provider_rows_ensure(limited=[], breakers=["p"])
    open_for = 0.0 if cooled else 3600.0
    model = Model()
    for kind, ok, failures in steps:
        if kind == "probe":
            token = await repo.provider_circuit_take_probe(provider="p", probe_seconds=3600)
            may_probe = model.state == "open" and cooled
            assert (token is not None) == may_probe, (model, steps)
            if token is not None:
                model.state, model.probe = "half-open", token
        else:
            probe: uuid.UUID | None = None
            if kind == "probe_result":
                probe = model.probe
            elif kind == "stale_probe_result":
                probe = uuid.uuid4()
            if probe is not None:
                failures = 0 if ok else 1
            await repo.provider_circuits_record(
                reports=[
                    CircuitReport(
                        "p", ok, failures, THRESHOLD, open_for, probe, ok if probe else None
                    )
                ]
            )
            if model.state == "half-open" and probe is not None and probe == model.probe:
                model.state = "closed" if ok else "open"
                model.probe = None
                model.failures = 0 if ok else model.failures
            elif model.state == "closed":
                model.failures = failures if ok else model.failures + failures
                if model.failures >= THRESHOLD:
                    model.state = "open"
        [row] = await raw.rows("SELECT state, failures, probe_token FROM nq_provider_circuits")
        assert row["state"] == model.state, (model, steps)
        assert row["probe_token"] == model.probe
        if model.state == "closed":
            assert row["failures"] == model.failures


@db_settings(40)
@given(
    per_second=st.sampled_from([5.0, 50.0, 1000.0]),
    horizon=st.sampled_from([0.1, 1.0, 2.0]),
    rounds=st.lists(
        st.lists(st.integers(min_value=1, max_value=60), min_size=1, max_size=4),
        min_size=1,
        max_size=4,
    ),
)
async def test_reserved_send_slots_never_overlap_and_stay_within_the_horizon(
    db: Database, raw: Raw, per_second: float, horizon: float, rounds: list[list[int]]
) -> None:
    await raw.conn.execute("TRUNCATE nq_provider_schedule")
    repo = ProviderRepository(db)
    await repo.provider_rows_ensure(limited=["p"], breakers=[])
    spacing = 1.0 / per_second
    slots = []
    for concurrent in rounds:  # each round: several workers reserving at the same moment
        reservations = await asyncio.gather(
            *(
                repo.provider_slots_reserve(
                    provider="p", wanted=n, step_seconds=spacing, horizon_seconds=horizon
                )
                for n in concurrent
            )
        )
        for wanted, r in zip(concurrent, reservations, strict=True):
            assert 0 <= r.granted <= wanted
            for i in range(r.granted):
                slot = r.first_slot.timestamp() + i * spacing
                assert slot <= r.clock.timestamp() + horizon + 1e-6
                slots.append(slot)
    slots.sort()
    gaps = [b - a for a, b in itertools.pairwise(slots)]
    assert all(g >= spacing - 1e-6 for g in gaps), min(gaps)
