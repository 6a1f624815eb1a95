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
    earliest probe or send slot without using an attempt; its `lastError` says why. The one place
    such a deferral is decided (a `waiting` field with its reason belongs here)."""
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
    )
