"""The failover rule (services/failover.py) against its promise: no notification delivered by two
providers unless its policy says `Always`.

Hypothesis draws a chain of providers and a run of attempts. In each attempt every provider's
circuit is open or closed, and every call comes back sent, with an unknown outcome (a timeout),
with an answer proving nothing was sent, or is lost with its worker (killed during the call). The
simulation follows the protocol of the worker and the statements: the claim binds an unbound row
to its chain's head and reports the binding it had as `sticky`; before a call the row is rebound
to the provider called, if another; a completion records `binding_after`; a worker lost during
a call leaves the binding as it was at the call. A provider "may have delivered" the key when it
was called and the outcome was sent, unknown, or lost. Under `OnDefiniteFailure` and `Never` at
most one provider ever may have delivered a key; under `Always` two may (its documented trade-off,
and the control that the property can fail).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from notify_queue.models import DeliveryResult, Failover, Outcome
from notify_queue.services.failover import (
    Skip,
    binding_after,
    may_move_on,
    providers_to_try,
    waiting_result,
)

CHAIN = ["a", "b", "c"]
ANSWERS = ["sent", "unknown", "nothing_sent", "killed"]

attempts = st.lists(
    st.tuples(
        st.fixed_dictionaries({name: st.booleans() for name in CHAIN}),  # circuit open?
        st.lists(st.sampled_from(ANSWERS), min_size=3, max_size=3),  # answers, in call order
    ),
    min_size=1,
    max_size=12,
)


def _result(answer: str) -> DeliveryResult:
    if answer == "sent":
        return DeliveryResult(Outcome.SENT, provider_message_id="m")
    return DeliveryResult(Outcome.TEMPORARY_FAILURE, nothing_sent=answer == "nothing_sent")


def _run(
    failover: Failover, runs: list[tuple[dict[str, bool], list[str]]], *, bind: bool = True
) -> set[str]:
    """Providers that may have delivered the key over the attempts, until one sends it. `bind`
    False: the claim reports no binding (0.1.0's rule), the negative control."""
    binding: str | None = None  # the row's bound_provider
    reached: set[str] = set()
    for circuits_open, answers in runs:
        sticky, binding = binding if bind else None, binding or CHAIN[0]  # the claim
        calls: list[tuple[str, DeliveryResult]] = []
        answers_left = iter(answers)
        lost = sent = False
        for name in providers_to_try(CHAIN, failover, sticky):
            if circuits_open[name]:
                continue
            binding = name  # rebound before the call (a no-op when it is the claim's)
            answer = next(answers_left)
            if answer != "nothing_sent":
                reached.add(name)
            if answer == "killed":
                lost = True
                break
            result = _result(answer)
            calls.append((name, result))
            if answer == "sent":
                sent = True
                break
            if not may_move_on(result, failover):
                break
        if sent:
            return reached
        if not lost:  # the completion; a lost worker's row keeps its binding (lease recovery)
            binding = binding_after(sticky, calls)
    return reached


@given(attempts)
def test_the_default_never_lets_two_providers_deliver_one_notification(runs) -> None:  # type: ignore[no-untyped-def]
    assert len(_run(Failover.ON_DEFINITE_FAILURE, runs)) <= 1


@given(attempts)
def test_never_keeps_to_one_provider(runs) -> None:  # type: ignore[no-untyped-def]
    assert len(_run(Failover.NEVER, runs)) <= 1


def test_always_can_reach_two_providers_its_documented_trade_off() -> None:
    closed = dict.fromkeys(CHAIN, False)
    assert _run(Failover.ALWAYS, [(closed, ["unknown", "sent", "sent"])]) == {"a", "b"}


def test_without_the_binding_an_open_circuit_sends_an_unknown_outcome_elsewhere() -> None:
    """The simulation's own negative control: the rule without `sticky` (what 0.1.0 did)."""
    closed = dict.fromkeys(CHAIN, False)
    a_open = {**closed, "a": True}
    for first in ("unknown", "killed"):  # a timeout at a, or a worker lost calling a; then a open
        runs = [(closed, [first, "sent", "sent"]), (a_open, ["sent", "sent", "sent"])]
        assert _run(Failover.ON_DEFINITE_FAILURE, runs, bind=False) == {"a", "b"}
        assert _run(Failover.ON_DEFINITE_FAILURE, runs) == {"a"}


def test_a_bound_notification_waits_for_its_provider_and_says_why() -> None:
    result = waiting_result([Skip("a", Outcome.CIRCUIT_OPEN, "circuit open", 2.5)], "a")
    assert result.outcome is Outcome.CIRCUIT_OPEN and not result.outcome.uses_attempt
    assert result.retry_after_seconds == 2.5
    assert result.bound_provider == "a"
    assert result.error is not None and result.error.startswith("waits for provider a")


def test_a_proof_that_nothing_was_sent_clears_a_fresh_binding_but_not_a_sticky_one() -> None:
    refused = DeliveryResult(Outcome.TEMPORARY_FAILURE, nothing_sent=True)
    timeout = DeliveryResult(Outcome.TEMPORARY_FAILURE)
    assert binding_after(None, [("a", refused)]) is None
    assert binding_after(None, [("a", refused), ("b", timeout)]) == "b"
    assert binding_after("a", [("a", refused)]) == "a"
    assert binding_after(None, []) is None
