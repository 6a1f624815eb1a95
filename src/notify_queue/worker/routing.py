"""Which provider gets a notification: chains, shared rate limits, circuit breakers, failover.

For each delivery the router walks the notification's chain (its policy's `providers`, else the
channel's chain from the providers file) and, per provider:

1. asks the circuit: closed passes; open is skipped until its cool-down ends; then exactly one
   delivery among all workers takes the probe (the shared row decides who) and the rest keep
   skipping until the probe's result closes or re-opens it;
2. takes a send slot when the provider has a rate limit: slots come from one schedule shared by
   every worker, reserved in batches (`SlotBook`), and the delivery sleeps until its slot; a slot
   further away than `--provider-wait-bound` is not taken (the provider counts as limited);
3. calls the provider with the worker's deadline (its timeout + a margin) around it.

Then the failover rule (CONTRACT section 9, docs/design.md "Providers"): SENT and permanent
failures end the walk. A temporary failure moves on to the next provider only when it proves
nothing was sent (connection refused, 429, 503), or after anything with `Always`; after a timeout
`OnDefiniteFailure` retries the same provider later (its idempotency key makes that safe; a
second provider could duplicate). When every provider was skipped (open or limited) nothing was
tried: the result says so, and the notification waits for the earliest probe or slot without
using an attempt.

Every call and every skip that led to another provider is recorded in the attempt's log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from notify_queue.errors import DatabaseUnavailable
from notify_queue.models import Channel, ClaimedNotification, DeliveryResult, Failover, Outcome
from notify_queue.provider_specs import ProviderSpec, ProviderSpecs
from notify_queue.providers.base import DeliveryRequest, Provider
from notify_queue.repositories.providers import CircuitRow, ProviderRepository
from notify_queue.services.circuits import CircuitTally
from notify_queue.worker.metrics import (
    CIRCUIT_STATE,
    CIRCUIT_TRANSITIONS,
    DELIVERIES,
    DELIVERY_DURATION,
)

log = logging.getLogger(__name__)

# The worker's deadline for one provider call: the provider's own timeout fires first and says
# what it saw; the deadline catches a provider that hangs anyway.
DEADLINE_MARGIN_SECONDS = 1.0
# Slots are spaced 4% wider than 1 / perSecond, so perSecond + 1 consecutive slots span 1.04 s.
# A send may start up to _LATE_SECONDS after its slot (a busy event loop wakes sleepers late);
# later than that the slot is given up and another taken, or a stalled worker would release its
# overdue sends in one burst. With 10 ms of lateness and 30 ms left for what happens between the
# check and the provider (the HTTP client, the network, a busy machine), no window of one second
# sees more than perSecond requests (docs/design.md "Providers"), at 96% of the limit.
_SPACING = 1.04
_LATE_SECONDS = 0.010
_SLOT_TRIES = 3
_CIRCUIT_CODES = {"closed": 0, "half-open": 1, "open": 2}


@dataclass(slots=True)
class _CircuitView:
    state: str
    open_until: float  # loop time
    probe_until: float  # loop time
    probing: bool = False  # a delivery of this worker is asking for the probe right now


class SlotBook:
    """The send slots of one rate-limited provider, reserved from the shared schedule.

    Deliveries that want a slot queue up; one reservation statement serves everyone queued at
    that moment, so a burst of 100 deliveries costs one round trip, not 100.
    """

    def __init__(
        self, name: str, per_second: float, repository: ProviderRepository, horizon_seconds: float
    ) -> None:
        self.name = name
        self._step = _SPACING / per_second
        self._repository = repository
        self._horizon = horizon_seconds
        self._waiting: list[asyncio.Future[float | None]] = []
        self._refill: asyncio.Task[None] | None = None
        self.free_in_seconds = 0.0  # when the schedule next has room, as of the last reservation

    async def take(self) -> float | None:
        """Seconds until this delivery's slot, or None when none is free within the horizon."""
        future: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        if self._refill is None or self._refill.done():
            self._refill = asyncio.create_task(self._reserve())
        return await future

    async def _reserve(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                r = await self._repository.provider_slots_reserve(
                    provider=self.name,
                    wanted=len(batch),
                    step_seconds=self._step,
                    horizon_seconds=self._horizon,
                )
            except Exception as exc:
                for future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            now = loop.time()
            start = now + (r.first_slot - r.clock).total_seconds()
            self.free_in_seconds = max((r.next_free - r.clock).total_seconds() - self._horizon, 0)
            for i, future in enumerate(batch):
                if future.done():
                    continue
                if i < r.granted:
                    future.set_result(max(start + i * self._step - now, 0.0))
                else:
                    future.set_result(None)


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


class Router:
    """Delivers one claimed notification along its chain (module docstring)."""

    def __init__(
        self,
        specs: ProviderSpecs,
        providers: dict[str, Provider],
        repository: ProviderRepository,
        *,
        failover: Failover,
        wait_bound_seconds: float = 2.0,
    ) -> None:
        self._specs = {p.name: p for p in specs.providers}
        self._chains = {c: specs.chain(c) for c in Channel}
        self._providers = providers
        self._repository = repository
        self._failover = failover
        self._books = {
            p.name: SlotBook(p.name, p.rate_limit.per_second, repository, wait_bound_seconds)
            for p in specs.providers
            if p.rate_limit is not None
        }
        self.circuits = Circuits(
            repository,
            {
                p.name: (
                    p.circuit_breaker.failures,
                    p.circuit_breaker.open_for_seconds,
                    p.timeout_seconds + DEADLINE_MARGIN_SECONDS + 5.0,
                )
                for p in specs.providers
                if p.circuit_breaker is not None
            },
        )
        self._counters: dict[tuple[str, str, str], Any] = {}
        self._durations: dict[str, Any] = {}

    async def start(self) -> None:
        breakers = [n for n, s in self._specs.items() if s.circuit_breaker is not None]
        if self._books or breakers:
            await self._repository.provider_rows_ensure(
                limited=list(self._books), breakers=breakers
            )
            await self.circuits.refresh()

    def chain(self, claimed: ClaimedNotification) -> list[str]:
        chain = [n for n in claimed.providers or () if n in self._specs] or self._chains[
            claimed.channel
        ]
        if (claimed.failover or self._failover) is Failover.NEVER:
            return chain[:1]
        return chain

    async def deliver(self, claimed: ClaimedNotification) -> DeliveryResult:
        failover = claimed.failover or self._failover
        request = DeliveryRequest(
            id=claimed.id,
            channel=claimed.channel,
            recipient=claimed.recipient,
            subject=claimed.subject,
            body=claimed.body,
            metadata=claimed.metadata,
        )
        attempts: list[dict[str, Any]] = []
        skipped: list[tuple[Outcome, str, float]] = []  # (why, error, seconds to wait)
        last_failure: tuple[DeliveryResult, str] | None = None  # the answer and who gave it
        for name in self.chain(claimed):
            spec = self._specs[name]
            may_call, probe, wait = await self.circuits.gate(name)
            if not may_call:
                skipped.append((Outcome.CIRCUIT_OPEN, f"{name}: circuit open", wait))
                attempts.append(_entry(name, Outcome.CIRCUIT_OPEN, "circuit open", None))
                self._count(claimed.channel, Outcome.CIRCUIT_OPEN, name)
                continue
            book = self._books.get(name)
            if book is not None:
                slot = await _wait_for_slot(book)
                if slot is None:
                    error = f"{name}: rate limit {spec.rate_limit.per_second:g}/s reached"  # type: ignore[union-attr]
                    skipped.append((Outcome.PROVIDER_LIMITED, error, book.free_in_seconds))
                    attempts.append(_entry(name, Outcome.PROVIDER_LIMITED, "rate limited", None))
                    self._count(claimed.channel, Outcome.PROVIDER_LIMITED, name)
                    continue
            result, seconds = await self._call(name, spec, request)
            self.circuits.observe(name, result.outcome, probe)
            attempts.append(_entry(name, result.outcome, result.error, seconds))
            self._count(claimed.channel, result.outcome, name, seconds)
            if result.outcome is not Outcome.TEMPORARY_FAILURE:
                return _finish(result, name, attempts)
            last_failure = (result, name)
            if not (result.nothing_sent or failover is Failover.ALWAYS):
                break
        if last_failure is not None:
            return _finish(*last_failure, attempts)
        # Nothing was tried: every provider of the chain was open or rate-limited. The skips are
        # not logged as attempts (the notification gets its attempt back and tries again).
        all_open = all(s[0] is Outcome.CIRCUIT_OPEN for s in skipped)
        why = Outcome.CIRCUIT_OPEN if all_open else Outcome.PROVIDER_LIMITED
        return DeliveryResult(
            why,
            error="; ".join(s[1] for s in skipped) or "no provider for this channel",
            retry_after_seconds=min((s[2] for s in skipped), default=1.0),
        )

    async def _call(
        self, name: str, spec: ProviderSpec, request: DeliveryRequest
    ) -> tuple[DeliveryResult, float]:
        deadline = spec.timeout_seconds + DEADLINE_MARGIN_SECONDS
        started = time.perf_counter()
        try:
            async with asyncio.timeout(deadline):
                result = await self._providers[name].deliver(request)
        except TimeoutError:
            result = DeliveryResult(
                Outcome.TEMPORARY_FAILURE,
                error=f"no answer within the worker's deadline of {deadline:g}s",
            )
        except Exception as exc:  # a provider bug must not kill the worker; retry it later
            log.exception("provider %s raised for %s", name, request.id)
            result = DeliveryResult(Outcome.TEMPORARY_FAILURE, error=f"provider error: {exc!r}")
        return result, time.perf_counter() - started

    def _count(
        self, channel: Channel, outcome: Outcome, provider: str, seconds: float | None = None
    ) -> None:
        key = (channel.value, outcome.value, provider)
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = DELIVERIES.labels(*key)
        counter.inc()
        if seconds is not None:
            duration = self._durations.get(channel.value)
            if duration is None:
                duration = self._durations[channel.value] = DELIVERY_DURATION.labels(channel.value)
            duration.observe(seconds)


async def _wait_for_slot(book: SlotBook) -> bool | None:
    """Sleep until this delivery's send slot; None when none is free within the horizon."""
    loop = asyncio.get_running_loop()
    for _ in range(_SLOT_TRIES):
        try:
            wait = await book.take()
        except DatabaseUnavailable:
            return None
        if wait is None:
            return None
        due = loop.time() + wait
        if wait > 0:
            await asyncio.sleep(wait)
        if loop.time() - due <= _LATE_SECONDS:
            return True
        # Woken too late: sending now could bunch with the slots after this one. Take a new one.
    return None


def _entry(name: str, outcome: Outcome, error: str | None, seconds: float | None) -> dict[str, Any]:
    return {
        "at": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "provider": name,
        "outcome": outcome.value,
        "error": error,
        "durationMs": None if seconds is None else round(seconds * 1000, 1),
    }


def _finish(result: DeliveryResult, name: str, attempts: list[dict[str, Any]]) -> DeliveryResult:
    # Built field by field: dataclasses.replace costs twice as much, on every delivery.
    return DeliveryResult(
        result.outcome,
        provider_message_id=result.provider_message_id,
        error=result.error,
        retry_after_seconds=result.retry_after_seconds,
        nothing_sent=result.nothing_sent,
        address_gone=result.address_gone,
        provider=name,
        attempts_json=json.dumps(attempts, ensure_ascii=False),
    )
