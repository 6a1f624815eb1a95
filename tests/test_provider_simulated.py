"""The simulated provider: its failure modes, its idempotency and its cost on the hot path.

It stands in for a real provider in development, benchmarks and the worker's tests, so these
tests pin down what those rely on: `invalid…` fails for good, `timeout…` times out, random
failures follow the seeded rate, a key is delivered at most once, and with no latency a call
finishes without ever suspending.
"""

from __future__ import annotations

import asyncio
import random
import uuid

import pytest

from notify_queue.models import Channel, Outcome
from notify_queue.providers.base import DeliveryRequest
from notify_queue.providers.simulated import SimulatedProvider


def make_request(
    recipient: str = "someone@example.com", key: uuid.UUID | None = None
) -> DeliveryRequest:
    return DeliveryRequest(
        id=key or uuid.uuid4(),
        channel=Channel.EMAIL,
        recipient=recipient,
        subject=None,
        body="hello",
    )


def make_provider(
    failure_rate: float = 0.0, latency_ms: float = 0.0, timeout_seconds: float = 5.0, seed: int = 7
) -> SimulatedProvider:
    return SimulatedProvider(failure_rate, latency_ms, timeout_seconds, rng=random.Random(seed))


async def test_a_delivery_is_sent_with_a_message_id_and_counted() -> None:
    provider = make_provider()
    request = make_request()

    result = await provider.deliver(request)

    assert result.outcome is Outcome.SENT
    assert result.provider_message_id == f"sim-{request.id.hex}"
    assert (provider.calls, provider.deliveries, provider.repeats) == (1, 1, 0)
    assert set(provider.delivered_keys) == {request.id}
    assert provider.delivery_count(request.id) == 1


async def test_a_repeated_key_answers_sent_with_the_original_id_without_delivering_again() -> None:
    provider = make_provider()
    request = make_request()

    first = await provider.deliver(request)
    again = await provider.deliver(request)

    assert again.outcome is Outcome.SENT
    assert again.provider_message_id == first.provider_message_id
    assert (provider.calls, provider.deliveries, provider.repeats) == (2, 1, 1)
    assert provider.delivery_count(request.id) == 1


async def test_concurrent_attempts_with_one_key_deliver_once() -> None:
    # Latency makes every attempt suspend, so all of them are in flight together.
    provider = make_provider(latency_ms=1)
    key = uuid.uuid4()

    results = await asyncio.gather(*(provider.deliver(make_request(key=key)) for _ in range(20)))

    assert {r.outcome for r in results} == {Outcome.SENT}
    assert len({r.provider_message_id for r in results}) == 1
    assert (provider.calls, provider.deliveries, provider.repeats) == (20, 1, 19)


async def test_a_recipient_starting_with_invalid_fails_permanently() -> None:
    provider = make_provider()
    request = make_request("invalid-user@example.com")

    result = await provider.deliver(request)

    assert result.outcome is Outcome.PERMANENT_FAILURE
    assert result.error is not None and "invalid recipient" in result.error
    assert provider.deliveries == 0
    assert provider.delivery_count(request.id) == 0


async def test_a_recipient_starting_with_timeout_waits_the_timeout_then_fails_temporarily() -> None:
    provider = make_provider(timeout_seconds=0.05)
    loop = asyncio.get_running_loop()
    started = loop.time()

    result = await provider.deliver(make_request("timeout-user@example.com"))

    assert loop.time() - started >= 0.045  # the loop may wake a clock tick early
    assert result.outcome is Outcome.TEMPORARY_FAILURE
    assert result.error == "timed out after 0.05s"
    assert provider.deliveries == 0


async def test_a_failure_rate_of_one_always_fails_temporarily() -> None:
    provider = make_provider(failure_rate=1.0)
    results = [await provider.deliver(make_request()) for _ in range(50)]
    assert {r.outcome for r in results} == {Outcome.TEMPORARY_FAILURE}
    assert provider.deliveries == 0


async def test_random_failures_follow_the_seeded_rate_and_retries_deliver_each_key_once() -> None:
    provider = make_provider(failure_rate=0.3, seed=42)
    keys = [uuid.uuid4() for _ in range(2000)]
    temporary_failures = 0
    for key in keys:
        while (await provider.deliver(make_request(key=key))).outcome is not Outcome.SENT:
            temporary_failures += 1

    # 2000 successes at a 30% failure rate take about 2000 * 0.3 / 0.7 ≈ 857 failures.
    assert 700 < temporary_failures < 1000
    assert provider.deliveries == len(provider.delivered_keys) == len(keys)
    assert provider.calls == len(keys) + temporary_failures
    assert provider.repeats == 0


async def test_the_same_seed_gives_the_same_failures() -> None:
    keys = [uuid.uuid4() for _ in range(200)]
    outcomes = []
    for _ in range(2):
        provider = make_provider(failure_rate=0.5, seed=3)
        outcomes.append([(await provider.deliver(make_request(key=k))).outcome for k in keys])
    assert outcomes[0] == outcomes[1]


def test_with_no_latency_a_delivery_completes_without_suspending() -> None:
    # Driving the coroutine by hand: one send() that ends in StopIteration means it never awaited
    # anything, not even sleep(0); no event loop is needed at all.
    provider = make_provider()
    coroutine = provider.deliver(make_request())
    with pytest.raises(StopIteration) as finished:
        coroutine.send(None)
    assert finished.value.value.outcome is Outcome.SENT


async def test_a_configured_latency_delays_each_delivery() -> None:
    provider = make_provider(latency_ms=30)
    loop = asyncio.get_running_loop()
    started = loop.time()

    result = await provider.deliver(make_request())

    assert loop.time() - started >= 0.025  # the loop may wake a clock tick early
    assert result.outcome is Outcome.SENT


@pytest.mark.parametrize(
    ("failure_rate", "latency_ms", "timeout_seconds"),
    [(-0.1, 0, 1), (1.5, 0, 1), (0, -1, 1), (0, 0, -1)],
)
def test_nonsense_settings_are_refused(
    failure_rate: float, latency_ms: float, timeout_seconds: float
) -> None:
    with pytest.raises(ValueError):
        SimulatedProvider(failure_rate, latency_ms, timeout_seconds)
