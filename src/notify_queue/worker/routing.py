"""Which provider gets a notification: chains, shared rate limits, circuit breakers, failover.

For each delivery the router walks the notification's chain (its policy's `providers`, else the
channel's chain from the providers file) and, per provider:

1. asks the circuit: closed passes; open is skipped until its cool-down ends; then exactly one
   delivery among all workers takes the probe (the shared row decides who) and the rest keep
   skipping until the probe's result closes or re-opens it;
2. takes a send slot when the provider has a rate limit: slots come from one schedule shared by
   every worker, reserved in batches (`SlotBook`), and the delivery sleeps until its slot; a slot
   further away than `--provider-wait-bound` is not taken (the provider counts as limited); a
   delivery that took the probe and then does not call hands the probe back at once;
3. calls the provider with the worker's deadline (its timeout + a margin) around it.

Before 2, the row is made to name that provider (the claim bound it to its chain's head; another
provider costs one statement), so an unknown outcome leaves the right provider named.

Then the failover rule (docs/providers.md, docs/design.md "Providers"): SENT and permanent
failures end the walk. A temporary failure moves on to the next provider only when it proves
nothing was sent (connection refused, 429, 503), or after anything with `Always`; after a timeout
`OnDefiniteFailure` retries the same provider later (its idempotency key makes that safe; a
second provider could duplicate), and keeps to it while its circuit is open: a row bound by an
unknown outcome is sent to no other provider (services/failover.py holds these rules). When every
provider was skipped (open or limited) nothing was tried: the result says so, and the
notification waits for the earliest probe or slot without using an attempt.

Every call and every skip that led to another provider is recorded in the attempt's log.

`deliver` is a loop of small steps: the pure `next_visit` (services/failover.py) names the next
provider and whether to rebind, `_visit` does that provider's I/O, and the pure `walk_end` says
what the attempt came to; the walk's decisions are made there, not here.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

from notify_queue import jsontext, tracing
from notify_queue.errors import DatabaseUnavailable
from notify_queue.models import (
    RESOLVE_PROVIDER_METADATA,
    Channel,
    ClaimedNotification,
    DeliveryResult,
    Failover,
    Outcome,
)
from notify_queue.providers.base import DeliveryRequest, Provider
from notify_queue.providers.specs import ProviderSpec, ProviderSpecs
from notify_queue.repositories.delivery import ChainHeads
from notify_queue.repositories.providers import ProviderRepository
from notify_queue.services.failover import (
    NextVisit,
    Skip,
    Visit,
    WalkEnd,
    next_visit,
    probe_unused,
    providers_to_try,
    walk_end,
)
from notify_queue.worker.circuits import Circuits
from notify_queue.worker.deadlines import Deadlines
from notify_queue.worker.metrics import DELIVERIES, DELIVERY_DURATION
from notify_queue.worker.slots import SlotBook, wait_for_slot

log = logging.getLogger(__name__)

# The worker's deadline for one provider call: the provider's own timeout fires first and says
# what it saw; the deadline catches a provider that hangs anyway.
DEADLINE_MARGIN_SECONDS = 1.0


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
        self._heads = ChainHeads(
            {c: chain[0] for c, chain in self._chains.items() if chain}, tuple(self._specs)
        )
        self._providers = providers
        self._repository = repository
        self._failover = failover
        self._books = {
            p.name: SlotBook(p.name, p.rate_limit.per_second, repository, wait_bound_seconds)
            for p in specs.providers
            if p.rate_limit is not None
        }
        # A vendor's limit per destination (a Slack channel, a PagerDuty routing key): one shared
        # schedule per (provider, destination), named "provider/destination" (no provider name
        # has a slash), reserved as a provider's is (docs/providers.md).
        self._destination_books = {
            (p.name, d): SlotBook(f"{p.name}/{d}", rate, repository, wait_bound_seconds)
            for p in specs.providers
            if (rate := p.destination_rate) is not None
            for d in p.destinations
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
        # Keyed by the members themselves: a StrEnum hashes as its text, in C, where `.value`
        # runs enum's Python property (~0.2 us each, three per delivery).
        self._counters: dict[tuple[Channel, Outcome, str], Any] = {}
        self._durations: dict[Channel, Any] = {}
        self._deadlines = Deadlines()

    async def start(self) -> None:
        breakers = [n for n, s in self._specs.items() if s.circuit_breaker is not None]
        # Which of its providers resolve on acknowledge, for the acknowledgement to read.
        await self._repository.provider_resolvers_record(
            resolving=[n for n, s in self._specs.items() if s.resolve_on_acknowledge],
            not_resolving=[n for n, s in self._specs.items() if not s.resolve_on_acknowledge],
        )
        limited = [*self._books, *(b.name for b in self._destination_books.values())]
        if limited or breakers:
            await self._repository.provider_rows_ensure(limited=limited, breakers=breakers)
            await self.circuits.refresh()

    @property
    def chain_heads(self) -> ChainHeads:
        """What the claim binds an unbound row to: the head of its chain (as `chain` reads it)."""
        return self._heads

    def chain(self, claimed: ClaimedNotification) -> list[str]:
        """The notification's chain: its policy's providers this worker knows, else its
        channel's (the claim's `chain_heads` must read it the same way). A resolve goes to the
        provider that sent the incident it resolves, and to no other."""
        pinned = claimed.metadata.get(RESOLVE_PROVIDER_METADATA) if claimed.metadata else None
        if pinned is not None and claimed.channel is Channel.INCIDENT and pinned in self._specs:
            return [pinned]
        return [n for n in claimed.providers or () if n in self._specs] or self._chains[
            claimed.channel
        ]

    async def deliver(self, claimed: ClaimedNotification) -> DeliveryResult:
        """Walk the notification's chain: each step visits the provider `next_visit` names, until
        it names none; `walk_end` says what the attempt came to (services/failover.py decides,
        this does the I/O)."""
        failover = claimed.failover or self._failover
        sticky = self._sticky(claimed)
        candidates = providers_to_try(self.chain(claimed), failover, sticky)
        attempt = _Attempt(claimed, _request(claimed))
        while (step := next_visit(candidates, failover, attempt.bound, attempt.visits)) is not None:
            await self._visit(step, attempt)
        return attempt.result(walk_end(attempt.visits, sticky))

    def _sticky(self, claimed: ClaimedNotification) -> str | None:
        sticky = claimed.sticky_provider
        if sticky is not None and sticky not in self._specs:
            # Bound to a provider this worker does not have (removed from the providers file):
            # nothing can call it any more, so the binding cannot keep the notification anywhere.
            log.warning("%s is bound to unknown provider %s: binding ignored", claimed.id, sticky)
            return None
        return sticky

    async def _visit(self, step: NextVisit, attempt: _Attempt) -> None:
        """One provider, in four steps: its circuit, the row's binding, its send slot, the call.
        Bound before the slot: a statement between the slot and the call would eat into the
        slack the rate limit leaves for that moment. A binding without a call is overwritten by
        this attempt's completion (and costs a lost worker's row only a wait)."""
        name, channel = step.provider, attempt.claimed.channel
        may_call, probe, wait = await self.circuits.gate(name)
        if not may_call:
            attempt.skipped(
                Visit(name, skip=Skip(name, Outcome.CIRCUIT_OPEN, "circuit open", wait))
            )
            self._count(channel, Outcome.CIRCUIT_OPEN, name)
            return
        skipped = await self._bind(name, attempt) if step.rebind else None
        if skipped is None:
            skipped = await self._take_slot(name, attempt.claimed.recipient)
            if skipped is not None:
                self._count(channel, Outcome.PROVIDER_LIMITED, name)
        if skipped is not None:
            attempt.skipped(skipped)
            if probe is not None and probe_unused(skipped, took_probe=True):
                await self.circuits.give_back(name, probe)
            return
        if tracing.recording():
            result, seconds = await self._call_traced(name, attempt)
        else:
            result, seconds = await self._call(name, self._specs[name], attempt.request)
        self.circuits.observe(name, result.outcome, probe)
        attempt.called(name, result, seconds)
        self._count(channel, result.outcome, name, seconds)

    async def _take_slot(self, name: str, recipient: str) -> Visit | None:
        """None once this delivery's send slots (the provider's, then its destination's) have
        come; a skip when one is not free in time."""
        book = self._books.get(name)
        if book is not None and not await wait_for_slot(book):
            per_second = self._specs[name].rate_limit.per_second  # type: ignore[union-attr]
            reason = f"rate limit {per_second:g}/s reached"
            skip = Skip(name, Outcome.PROVIDER_LIMITED, reason, book.free_in_seconds)
            return Visit(name, skip=skip)
        book = self._destination_books.get((name, recipient))
        if book is not None and not await wait_for_slot(book):
            per_second = self._specs[name].destination_rate
            reason = f"rate limit {per_second:g}/s for destination {recipient} reached"
            skip = Skip(name, Outcome.PROVIDER_LIMITED, reason, book.free_in_seconds)
            return Visit(name, skip=skip)
        return None

    async def _bind(self, name: str, attempt: _Attempt) -> Visit | None:
        """The row names the provider it is about to call before the call (its `provider`
        column): one statement. None once bound; a skip that ends the walk when it could not be
        bound (no other provider either: binding one would fail the same way, and the
        notification tries again shortly without using an attempt)."""
        claimed = attempt.claimed
        try:
            bound = await self._repository.notification_bind_provider(
                id=claimed.id, claim_token=claimed.claim_token, provider=name
            )
            why = "the claim was lost"
        except DatabaseUnavailable as exc:
            bound, why = False, str(exc)
        if bound:
            attempt.bound = name
            return None
        skip = Skip(name, Outcome.PROVIDER_LIMITED, f"not bound ({why})", 1.0)
        return Visit(name, skip=skip, ends_walk=True)

    async def _call_traced(self, name: str, attempt: _Attempt) -> tuple[DeliveryResult, float]:
        """The call as a span in the delivery's trace; an HTTP provider's request is a child
        span that carries `traceparent` to the provider (aiohttp's instrumentation)."""
        with tracing.span(
            "notify_queue.provider.call",
            kind="client",
            attributes={
                tracing.NOTIFICATION_ID: str(attempt.claimed.id),
                tracing.CHANNEL: attempt.claimed.channel.value,
                tracing.PROVIDER: name,
                tracing.ATTEMPT: attempt.claimed.attempt_count,
            },
        ) as span:
            result, seconds = await self._call(name, self._specs[name], attempt.request)
            if span is not None:
                span.set_attribute(tracing.OUTCOME, result.outcome.value)
                if result.error is not None:
                    span.set_attribute("error.type", result.outcome.value)
        return result, seconds

    async def _call(
        self, name: str, spec: ProviderSpec, request: DeliveryRequest
    ) -> tuple[DeliveryResult, float]:
        deadline = spec.timeout_seconds + DEADLINE_MARGIN_SECONDS
        started = time.perf_counter()
        try:
            with self._deadlines.within(deadline):
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
        key = (channel, outcome, provider)
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = DELIVERIES.labels(str(channel), str(outcome), provider)
        counter.inc()
        if seconds is not None:
            duration = self._durations.get(channel)
            if duration is None:
                duration = self._durations[channel] = DELIVERY_DURATION.labels(str(channel))
            duration.observe(seconds)


class MillisecondClock:
    """The time as the attempt log writes it (`2026-12-05T15:52:56.123Z`: UTC, milliseconds,
    truncated as `isoformat(timespec="milliseconds")` truncates), formatted once per millisecond.

    Every attempt's entry carries one; formatting a `datetime` takes ~2 µs, a worker's whole
    delivery ~90, and the deliveries of a claimed batch finish within the same few milliseconds,
    so most entries reuse the text of the one before."""

    __slots__ = ("_millisecond", "_text")

    def __init__(self) -> None:
        self._millisecond = -1
        self._text = ""

    def now(self) -> str:
        millisecond = time.time_ns() // 1_000_000
        if millisecond != self._millisecond:
            seconds, part = divmod(millisecond, 1000)
            moment = datetime.fromtimestamp(seconds, UTC).replace(microsecond=part * 1000)
            self._text = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
            self._millisecond = millisecond
        return self._text


_CLOCK = MillisecondClock()


def _entry(name: str, outcome: Outcome, error: str | None, seconds: float | None) -> dict[str, Any]:
    return {
        "at": _CLOCK.now(),
        "provider": name,
        "outcome": str(outcome),
        "error": error,
        "durationMs": None if seconds is None else round(seconds * 1000, 1),
    }


def _request(claimed: ClaimedNotification) -> DeliveryRequest:
    return DeliveryRequest(
        # A digest's carrier sends the digest: its id is the provider's idempotency key, the
        # same on every attempt whichever item carries it (docs/digests.md).
        id=claimed.digest_id or claimed.id,
        channel=claimed.channel,
        recipient=claimed.recipient,
        subject=claimed.subject,
        body=claimed.body,
        metadata=claimed.metadata,
        priority=claimed.priority,
        headers=claimed.email_headers,
    )


class _Attempt:
    """One delivery attempt's record: its visits in order, their log entries, and the provider its
    row is bound to right now."""

    __slots__ = ("_entries", "bound", "claimed", "request", "visits")

    def __init__(self, claimed: ClaimedNotification, request: DeliveryRequest) -> None:
        self.claimed = claimed
        self.request = request
        self.bound = claimed.bound_provider
        self.visits: list[Visit] = []
        self._entries: list[dict[str, Any]] = []

    def skipped(self, visit: Visit) -> None:
        self.visits.append(visit)
        if visit.skip is not None:
            skip = visit.skip
            self._entries.append(_entry(skip.provider, skip.outcome, skip.reason, None))

    def called(self, name: str, result: DeliveryResult, seconds: float) -> None:
        self.visits.append(Visit(name, result=result))
        self._entries.append(_entry(name, result.outcome, result.error, seconds))

    def result(self, end: WalkEnd) -> DeliveryResult:
        """The attempt's result as `walk_end` decided it; when something was called, with this
        attempt's log (skips are not logged as attempts when nothing was called: the
        notification gets its attempt back)."""
        if end.provider is None:
            return end.result
        return _finish(end.result, end.provider, self._entries, end.bound_provider)


def _finish(
    result: DeliveryResult, name: str, attempts: list[dict[str, Any]], bound_provider: str | None
) -> DeliveryResult:
    # Built field by field: dataclasses.replace costs twice as much, on every delivery.
    return DeliveryResult(
        result.outcome,
        provider_message_id=result.provider_message_id,
        error=result.error,
        retry_after_seconds=result.retry_after_seconds,
        nothing_sent=result.nothing_sent,
        address_gone=result.address_gone,
        provider=name,
        # orjson (jsontext): a tenth of the standard library's time, on every delivery.
        attempts_json=jsontext.dumps_text(attempts),
        bound_provider=bound_provider,
        waiting_detail=result.waiting_detail,
    )
