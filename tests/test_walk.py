"""One attempt's walk along its chain, decided by pure functions (services/failover.py).

The router (worker/routing.py) does the I/O of each visit; `next_visit` says which provider comes
next and whether the row must be rebound first, `probe_unused` whether a half-open probe goes back,
and `walk_end` what the attempt comes to. These tests go over their inputs without a database, a
provider or a clock.
"""

from __future__ import annotations

import pytest

from notify_queue.models import DeliveryResult, Failover, Outcome
from notify_queue.services.failover import (
    NextVisit,
    Skip,
    Visit,
    next_visit,
    probe_unused,
    walk_end,
)

CHAIN = ["a", "b", "c"]
SENT = DeliveryResult(Outcome.SENT, provider_message_id="m")
FAILED = DeliveryResult(Outcome.PERMANENT_FAILURE, error="400")
NOTHING_SENT = DeliveryResult(Outcome.TEMPORARY_FAILURE, error="503", nothing_sent=True)
UNKNOWN = DeliveryResult(Outcome.TEMPORARY_FAILURE, error="timeout")


def called(name: str, result: DeliveryResult) -> Visit:
    return Visit(name, result=result)


def circuit_open(name: str, wait: float = 5.0) -> Visit:
    return Visit(name, skip=Skip(name, Outcome.CIRCUIT_OPEN, "circuit open", wait))


def limited(name: str, wait: float = 2.0) -> Visit:
    return Visit(name, skip=Skip(name, Outcome.PROVIDER_LIMITED, "rate limit 5/s reached", wait))


def not_bound(name: str) -> Visit:
    skip = Skip(name, Outcome.PROVIDER_LIMITED, "not bound (the claim was lost)", 1.0)
    return Visit(name, skip=skip, ends_walk=True)


def test_the_walk_starts_at_the_first_candidate_without_rebinding_the_row_the_claim_bound() -> None:
    assert next_visit(CHAIN, Failover.ON_DEFINITE_FAILURE, "a", []) == NextVisit("a", False)


def test_a_row_bound_to_another_provider_is_rebound_before_the_visit() -> None:
    assert next_visit(CHAIN, Failover.ON_DEFINITE_FAILURE, None, []) == NextVisit("a", True)
    visits = [called("a", NOTHING_SENT)]
    assert next_visit(CHAIN, Failover.ON_DEFINITE_FAILURE, "a", visits) == NextVisit("b", True)


@pytest.mark.parametrize("failover", list(Failover))
@pytest.mark.parametrize("answer", [SENT, FAILED])
def test_a_sent_or_permanently_failed_call_ends_the_walk(
    failover: Failover, answer: DeliveryResult
) -> None:
    assert next_visit(CHAIN, failover, "a", [called("a", answer)]) is None


def test_an_answer_proving_nothing_was_sent_moves_on_to_the_next_provider() -> None:
    visits = [called("a", NOTHING_SENT)]
    assert next_visit(CHAIN, Failover.ON_DEFINITE_FAILURE, "a", visits) == NextVisit("b", True)


def test_an_unknown_outcome_moves_on_only_under_always() -> None:
    visits = [called("a", UNKNOWN)]
    assert next_visit(CHAIN, Failover.ON_DEFINITE_FAILURE, "a", visits) is None
    assert next_visit(CHAIN, Failover.ALWAYS, "a", visits) == NextVisit("b", True)


def test_a_skipped_provider_moves_on_but_a_row_that_could_not_be_bound_ends_the_walk() -> None:
    policy = Failover.ON_DEFINITE_FAILURE
    assert next_visit(CHAIN, policy, "a", [circuit_open("a")]) == NextVisit("b", True)
    assert next_visit(CHAIN, policy, "a", [limited("a")]) == NextVisit("b", True)
    assert next_visit(CHAIN, policy, "a", [circuit_open("a"), not_bound("b")]) is None


def test_the_walk_ends_after_the_last_candidate() -> None:
    visits = [circuit_open("a"), limited("b"), called("c", NOTHING_SENT)]
    assert next_visit(CHAIN, Failover.ALWAYS, "c", visits) is None
    assert next_visit([], Failover.ALWAYS, None, []) is None


def test_a_probe_goes_back_only_when_its_visit_did_not_call() -> None:
    assert probe_unused(limited("a"), took_probe=True)
    assert probe_unused(not_bound("a"), took_probe=True)
    assert not probe_unused(called("a", UNKNOWN), took_probe=True)
    assert not probe_unused(limited("a"), took_probe=False)


def test_the_last_call_answers_and_an_unknown_outcome_keeps_the_binding() -> None:
    end = walk_end([called("a", NOTHING_SENT), called("b", SENT)], None)
    assert (end.provider, end.result, end.bound_provider) == ("b", SENT, None)
    end = walk_end([called("a", UNKNOWN), called("b", NOTHING_SENT)], None)
    assert (end.provider, end.result, end.bound_provider) == ("b", NOTHING_SENT, "a")


def test_a_sticky_binding_stays_whatever_the_provider_answers_now() -> None:
    end = walk_end([called("a", NOTHING_SENT)], "a")
    assert end.bound_provider == "a"


def test_when_nothing_was_called_the_attempt_waits_for_the_earliest_probe_or_slot() -> None:
    end = walk_end([circuit_open("a", 5.0), limited("b", 2.0)], None)
    assert end.provider is None
    assert end.result.outcome is Outcome.PROVIDER_LIMITED  # not all open: limited
    assert end.result.retry_after_seconds == 2.0
    assert end.result.error == "a: circuit open; b: rate limit 5/s reached"
    end = walk_end([circuit_open("a", 5.0), circuit_open("b", 3.0)], "a")
    assert end.result.outcome is Outcome.CIRCUIT_OPEN
    assert end.bound_provider == "a"
    assert end.result.error is not None and end.result.error.startswith("waits for provider a")


def test_an_empty_walk_says_there_is_no_provider() -> None:
    end = walk_end([], None)
    assert end.provider is None
    assert end.result.error == "no provider for this channel"
