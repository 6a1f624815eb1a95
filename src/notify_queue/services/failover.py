"""The failover rule as pure functions: which providers one attempt may call, when it moves on,
which provider the notification stays bound to, and what it says while it waits.

Why a binding (docs/providers.md "Failover and the cost of a duplicate"): a provider knows a
notification's idempotency key only if it was called with it. When the outcome of a call is
unknown (a timeout, a worker killed during the call, a result lost with its lease), that provider
may have delivered it, and a second provider never saw the key. So before any call the row is
bound to the provider it goes to (the claim binds it to its chain's head; the worker rebinds it
before calling another), a completion keeps the binding while the outcome there is unknown, and
under `OnDefiniteFailure` a row whose previous attempt left a binding (`sticky`) goes to that
provider only: when its circuit is open or its rate is taken, the notification waits for it,
without using an attempt. `Always` keeps its trade-off (a late duplicate rather than none) and
walks its chain; `Never` keeps to the first provider.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from notify_queue.models import DeliveryResult, Failover, Outcome


@dataclass(frozen=True, slots=True)
class Skip:
    """A provider of the chain that was not called: its circuit was open, its send rate taken,
    or the row could not be bound to it; `wait_seconds` until it may be asked again."""

    provider: str
    outcome: Outcome  # CIRCUIT_OPEN or PROVIDER_LIMITED
    reason: str  # "circuit open", "rate limit 50/s reached"
    wait_seconds: float

    @property
    def error(self) -> str:
        return f"{self.provider}: {self.reason}"


def providers_to_try(chain: Sequence[str], failover: Failover, sticky: str | None) -> list[str]:
    """The providers this attempt may call, in order. `sticky`: the provider an earlier attempt
    left the row bound to (its outcome there is unknown), or None."""
    if sticky is not None and failover is not Failover.ALWAYS:
        return [sticky]
    if failover is Failover.NEVER:
        return list(chain[:1])
    return list(chain)


def may_move_on(result: DeliveryResult, failover: Failover) -> bool:
    """After a temporary failure: may the next provider of the chain be called in this attempt?
    Only when the answer proves nothing was sent, or under `Always`."""
    return result.nothing_sent or failover is Failover.ALWAYS


def outcome_unknown(result: DeliveryResult) -> bool:
    """The provider may have delivered it: a temporary failure that proves nothing."""
    return result.outcome is Outcome.TEMPORARY_FAILURE and not result.nothing_sent


def binding_after(sticky: str | None, calls: Sequence[tuple[str, DeliveryResult]]) -> str | None:
    """The provider the notification stays bound to after this attempt's `calls` (in order): the
    sticky one (the earlier unknown outcome stays unknown whatever it answers now), else the last
    provider called whose outcome is unknown, else None (nothing reached any provider)."""
    if sticky is not None:
        return sticky
    for name, result in reversed(calls):
        if outcome_unknown(result):
            return name
    return None


def waiting_result(skips: Sequence[Skip], sticky: str | None) -> DeliveryResult:
    """Nothing was called: every provider it may use was skipped. The notification waits for the
    earliest probe or send slot without using an attempt; its `lastError` says why, and its
    `waiting` (reason `CircuitOpen` when every skip was an open circuit, else
    `ProviderRateLimit`; services/delivery.py) carries `waiting_detail`, one sentence naming the
    provider(s). The one place such a deferral is decided."""
    all_open = all(s.outcome is Outcome.CIRCUIT_OPEN for s in skips)
    error = "; ".join(s.error for s in skips) or "no provider for this channel"
    if sticky is not None:
        error = (
            f"waits for provider {sticky} ({error}): the outcome of an earlier attempt there is"
            " unknown, so no other provider is tried"
        )
    return DeliveryResult(
        Outcome.CIRCUIT_OPEN if all_open else Outcome.PROVIDER_LIMITED,
        error=error,
        retry_after_seconds=min((s.wait_seconds for s in skips), default=1.0),
        bound_provider=sticky,
        waiting_detail=waiting_detail(skips, sticky),
    )


def waiting_detail(skips: Sequence[Skip], sticky: str | None) -> str:
    """One sentence naming the provider(s) a notification waits for and why each was skipped:
    `provider sms-main's circuit is open`, `providers a (circuit open) and b (rate limit 50/s
    reached) cannot take it now`."""
    if not skips:
        return "no provider this worker knows serves its channel"
    if len(skips) == 1:
        skip = skips[0]
        if skip.outcome is Outcome.CIRCUIT_OPEN:
            sentence = f"provider {skip.provider}'s circuit is open"
        else:
            sentence = f"provider {skip.provider} cannot take it now ({skip.reason})"
    else:
        named = [f"{s.provider} ({s.reason})" for s in skips]
        sentence = f"providers {', '.join(named[:-1])} and {named[-1]} cannot take it now"
    if sticky is not None:
        sentence += (
            f"; it waits for {sticky}, where an earlier attempt's outcome is unknown, so no other"
            " provider is tried"
        )
    return sentence


# -- one attempt's walk along its chain, as decisions over what happened so far -----------------
#
# The router (worker/routing.py) does the I/O of each visit (the circuit, the binding, the send
# slot, the call); these functions decide, from what its visits so far came to, which provider it
# visits next, whether the row must be rebound first, whether a probe it took goes back, and what
# the attempt's result is. No I/O, no clock: unit-tested over their inputs (tests/test_walk.py).


@dataclass(frozen=True, slots=True)
class Visit:
    """One provider of the walk and what came of it: its answer when it was called, else why it
    was skipped. `ends_walk`: a skip no other provider can help (the row could not be bound)."""

    provider: str
    result: DeliveryResult | None = None
    skip: Skip | None = None
    ends_walk: bool = False


@dataclass(frozen=True, slots=True)
class NextVisit:
    """The provider to visit next, and whether the row must be bound to it first (it names
    another provider now: the claim bound it to its chain's head, or a visit rebound it)."""

    provider: str
    rebind: bool


@dataclass(frozen=True, slots=True)
class WalkEnd:
    """What the attempt comes to. `provider` answered last and its answer is `result`; None when
    nothing was called, and `result` is then the wait for the earliest probe or send slot.
    `bound_provider` is the binding its completion records."""

    provider: str | None
    result: DeliveryResult
    bound_provider: str | None


def next_visit(
    candidates: Sequence[str], failover: Failover, bound: str | None, visits: Sequence[Visit]
) -> NextVisit | None:
    """The next provider of `candidates` (`providers_to_try`) to visit, or None when the walk is
    over: the last call ended it (sent, failed for good, or a temporary failure that may not move
    on), a skip ended it, or every candidate was visited. `bound`: the row's binding now."""
    if visits:
        last = visits[-1]
        if last.ends_walk:
            return None
        if last.result is not None and (
            last.result.outcome is not Outcome.TEMPORARY_FAILURE
            or not may_move_on(last.result, failover)
        ):
            return None
    if len(visits) >= len(candidates):
        return None
    provider = candidates[len(visits)]
    return NextVisit(provider, rebind=bound != provider)


def probe_unused(visit: Visit, *, took_probe: bool) -> bool:
    """A visit that took its circuit's half-open probe and then did not call (no binding, no send
    slot) hands it back at once: otherwise nobody, on any worker, probes until it times out."""
    return took_probe and visit.result is None


def walk_end(visits: Sequence[Visit], sticky: str | None) -> WalkEnd:
    """The attempt's result: the last call's answer (it ended the walk) with the binding that
    stays (`binding_after`), or, when nothing was called, the wait (`waiting_result`)."""
    calls = [(v.provider, v.result) for v in visits if v.result is not None]
    if not calls:
        skips = [v.skip for v in visits if v.skip is not None]
        return WalkEnd(None, waiting_result(skips, sticky), sticky)
    provider, result = calls[-1]
    return WalkEnd(provider, result, binding_after(sticky, calls))
