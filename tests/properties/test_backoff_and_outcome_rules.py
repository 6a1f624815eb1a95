"""The pure delivery rules, for every input: backoff ranges and caps, Retry-After, what an
attempt's outcome does to a notification, and what a webhook POST's result does to its event."""

from __future__ import annotations

import random
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from notify_queue.models import (
    Channel,
    ClaimedNotification,
    DeliveryResult,
    Outcome,
    Priority,
    Status,
    WebhookEvent,
)
from notify_queue.services.backoff import backoff_seconds, retry_after_seconds
from notify_queue.services.delivery import decide_completion
from notify_queue.services.webhooks import decide_webhook_result
from tests.properties.conftest import examples

attempts = st.integers(min_value=1, max_value=500)
seconds = st.floats(min_value=0.001, max_value=10_000, allow_nan=False, allow_infinity=False)
seeds = st.integers(min_value=0, max_value=2**32)


@settings(max_examples=examples(500))
@given(attempt=attempts, base=seconds, cap=seconds, seed=seeds)
def test_a_backoff_lies_in_its_doubling_range_and_never_past_the_cap(
    attempt: int, base: float, cap: float, seed: int
) -> None:
    wait = backoff_seconds(attempt, base=base, maximum=cap, rng=random.Random(seed))
    ceiling = base * 2.0 ** min(attempt, 62)
    assert 0 < wait <= cap
    assert min(ceiling / 2, cap) <= wait <= min(ceiling, cap)


@settings(max_examples=examples(300))
@given(attempt=st.integers(min_value=1, max_value=60), base=seconds, cap=seconds)
def test_the_backoff_range_never_shrinks_from_one_attempt_to_the_next(
    attempt: int, base: float, cap: float
) -> None:
    def bounds(n: int) -> tuple[float, float]:
        low = backoff_seconds(n, base=base, maximum=cap, rng=_Fixed(0.0))
        high = backoff_seconds(n, base=base, maximum=cap, rng=_Fixed(1.0))
        return low, high

    (low1, high1), (low2, high2) = bounds(attempt), bounds(attempt + 1)
    assert low1 <= low2 and high1 <= high2


class _Fixed(random.Random):
    """A generator whose uniform(a, b) is always the same end of the range."""

    def __init__(self, where: float) -> None:
        super().__init__(0)
        self._where = where

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * self._where


@given(attempt=st.integers(max_value=0))
def test_attempts_are_counted_from_one(attempt: int) -> None:
    with pytest.raises(ValueError):
        backoff_seconds(attempt, base=0.5, maximum=60)


@settings(max_examples=examples(300))
@given(hint=st.floats(min_value=-1e9, max_value=1e9, allow_nan=False), cap=seconds)
def test_a_retry_after_hint_is_obeyed_within_zero_and_the_cap(hint: float, cap: float) -> None:
    wait = retry_after_seconds(hint, maximum=cap)
    assert 0 <= wait <= cap
    if 0 <= hint <= cap:
        assert wait == hint


def _claimed(attempt: int, max_attempts: int, base: float, cap: float) -> ClaimedNotification:
    return ClaimedNotification(
        uuid.uuid4(),
        uuid.uuid4(),
        Channel.SMS,
        "+491511234567",
        None,
        "b",
        {},
        attempt,
        max_attempts,
        base,
        cap,
        Priority.NORMAL,
    )


outcomes = st.builds(
    DeliveryResult,
    outcome=st.sampled_from([Outcome.SENT, Outcome.TEMPORARY_FAILURE, Outcome.PERMANENT_FAILURE]),
    provider_message_id=st.none() | st.text(min_size=1, max_size=20),
    error=st.none() | st.text(max_size=3000),
    retry_after_seconds=st.none() | st.floats(min_value=0, max_value=1e6),
)


@settings(max_examples=examples(500))
@given(
    max_attempts=st.integers(min_value=1, max_value=100),
    attempt_offset=st.integers(min_value=-99, max_value=1),
    result=outcomes,
    base=seconds,
    cap=seconds,
    seed=seeds,
)
def test_an_attempts_outcome_leads_only_where_the_rules_say(
    max_attempts: int,
    attempt_offset: int,
    result: DeliveryResult,
    base: float,
    cap: float,
    seed: int,
) -> None:
    # attempt max+1 is the final re-check after a crash on the last attempt.
    attempt = max(1, max_attempts + attempt_offset)
    claimed = _claimed(attempt, max_attempts, base, cap)
    done = decide_completion(claimed, result, rng=random.Random(seed))
    assert (done.id, done.claim_token) == (claimed.id, claimed.claim_token)
    assert done.last_error is None or len(done.last_error) <= 1000
    if result.outcome is Outcome.SENT:
        assert done.status is Status.SENT and done.retry_in_seconds is None
        assert done.provider_message_id == result.provider_message_id
    elif result.outcome is Outcome.PERMANENT_FAILURE:
        assert done.status is Status.FAILED and done.retry_in_seconds is None
    elif attempt >= max_attempts:
        assert done.status is Status.DEAD_LETTERED and done.retry_in_seconds is None
    else:
        assert done.status is Status.PENDING
        assert done.retry_in_seconds is not None and 0 <= done.retry_in_seconds <= cap
        if result.retry_after_seconds is not None:
            assert done.retry_in_seconds == min(result.retry_after_seconds, cap)


@settings(max_examples=examples(300))
@given(
    max_attempts=st.integers(min_value=1, max_value=100),
    attempt=st.integers(min_value=1, max_value=100),
    error=st.none() | st.text(min_size=1, max_size=50),
    seed=seeds,
)
def test_a_webhook_post_result_moves_only_its_event(
    max_attempts: int, attempt: int, error: str | None, seed: int
) -> None:
    event = WebhookEvent(
        uuid.uuid4(), uuid.uuid4(), "https://hooks.example/x", "{}", (), attempt, uuid.uuid4()
    )
    result = decide_webhook_result(
        event,
        error,
        max_attempts=max_attempts,
        backoff_base_seconds=1.0,
        backoff_max_seconds=300.0,
        rng=random.Random(seed),
    )
    assert (result.id, result.claim_token) == (event.id, event.claim_token)
    if error is None:
        assert result.delivered and result.retry_in_seconds is None
    elif attempt >= max_attempts:
        assert not result.delivered and result.retry_in_seconds is None  # failed for good
    else:
        assert not result.delivered and result.retry_in_seconds is not None
        assert 0 < result.retry_in_seconds <= 300
