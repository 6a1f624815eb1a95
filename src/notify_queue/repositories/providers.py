"""Provider state shared by every worker: send schedules (rate limits), circuit breakers, and the
provider a notification's attempt is bound to."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypedDict

from notify_queue.repositories.db import Database


class CircuitsRecord(TypedDict):
    """`provider_circuits_record`: one element per provider's report, in each array."""

    providers: list[str]
    had_success: list[bool]
    trailing_failures: list[int]
    thresholds: list[int]
    open_for_seconds: list[float]
    probe_tokens: list[uuid.UUID | None]
    probe_ok: list[bool | None]


@dataclass(frozen=True, slots=True)
class Reservation:
    first_slot: datetime
    granted: int
    clock: datetime  # the database's clock when reserved: slot times are relative to it
    next_free: datetime


@dataclass(frozen=True, slots=True)
class CircuitRow:
    provider: str
    state: str  # closed | open | half-open
    open_until: datetime | None
    probe_until: datetime | None
    clock: datetime


@dataclass(frozen=True, slots=True)
class CircuitReport:
    """A worker's outcomes for one provider since its last report."""

    provider: str
    had_success: bool
    trailing_failures: int
    threshold: int
    open_for_seconds: float
    probe_token: uuid.UUID | None = None
    probe_ok: bool | None = None


@dataclass(frozen=True, slots=True)
class CircuitChange:
    provider: str
    old_state: str
    state: str
    open_until: datetime | None
    clock: datetime


class ProviderRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def provider_rows_ensure(
        self, *, limited: Sequence[str], breakers: Sequence[str]
    ) -> None:
        await self._db.execute(
            "provider_rows_ensure", {"limited": list(limited), "breakers": list(breakers)}
        )

    async def provider_resolvers_record(
        self, *, resolving: Sequence[str], not_resolving: Sequence[str]
    ) -> None:
        await self._db.execute(
            "provider_resolvers_record",
            {"resolving": list(resolving), "not_resolving": list(not_resolving)},
        )

    async def provider_slots_reserve(
        self, *, provider: str, wanted: int, step_seconds: float, horizon_seconds: float
    ) -> Reservation:
        row = await self._db.fetch_one(
            "provider_slots_reserve",
            {
                "provider": provider,
                "wanted": wanted,
                "step_seconds": step_seconds,
                "horizon_seconds": horizon_seconds,
            },
        )
        assert row is not None, f"no schedule row for {provider}"
        return Reservation(row["first_slot"], row["granted"], row["clock"], row["next_free"])

    async def provider_circuits_read(self) -> list[CircuitRow]:
        rows = await self._db.fetch_all("provider_circuits_read")
        return [
            CircuitRow(r["provider"], r["state"], r["open_until"], r["probe_until"], r["clock"])
            for r in rows
        ]

    async def provider_circuit_take_probe(
        self, *, provider: str, probe_seconds: float
    ) -> uuid.UUID | None:
        row = await self._db.fetch_one(
            "provider_circuit_take_probe", {"provider": provider, "probe_seconds": probe_seconds}
        )
        return row["probe_token"] if row else None

    async def provider_circuit_return_probe(self, *, provider: str, probe_token: uuid.UUID) -> None:
        """Hand back a probe that was taken but not used: the next delivery that asks takes it."""
        await self._db.execute(
            "provider_circuit_return_probe", {"provider": provider, "probe_token": probe_token}
        )

    async def notification_bind_provider(
        self, *, id: uuid.UUID, claim_token: uuid.UUID, provider: str
    ) -> bool:
        """Bind a claimed notification to the provider it is about to call; False: the claim
        was lost (the lease ran out and the row was recovered), so it must not be called."""
        row = await self._db.fetch_one(
            "notification_bind_provider",
            {"id": id, "claim_token": claim_token, "provider": provider},
        )
        return row is not None

    async def provider_circuits_record(
        self, *, reports: Sequence[CircuitReport]
    ) -> list[CircuitChange]:
        if not reports:
            return []
        params: CircuitsRecord = {
            "providers": [r.provider for r in reports],
            "had_success": [r.had_success for r in reports],
            "trailing_failures": [r.trailing_failures for r in reports],
            "thresholds": [r.threshold for r in reports],
            "open_for_seconds": [r.open_for_seconds for r in reports],
            "probe_tokens": [r.probe_token for r in reports],
            "probe_ok": [r.probe_ok for r in reports],
        }
        rows = await self._db.fetch_all("provider_circuits_record", params)
        return [
            CircuitChange(r["provider"], r["old_state"], r["state"], r["open_until"], r["clock"])
            for r in rows
        ]
