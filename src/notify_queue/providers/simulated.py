"""A provider that delivers nowhere, for development, benchmarks and fault tests.

It behaves like a real provider that honours idempotency keys: it fails at random at
`failure_rate` (temporarily), fails permanently for recipients starting with `invalid`, times
out for recipients starting with `timeout`, and never delivers the same key twice (a repeat
answers SENT with the first delivery's message id, as a real provider's idempotency layer
would).

It has no way to harm the process it runs in: it is the default provider, and whoever can
create a notification chooses its recipient. Poison-message tests crash a worker from outside.

It sits on the benchmark's hot path (20,000 deliveries a second), so a call allocates nothing it
can avoid: failure results are built once, the random generator is consulted only when failures
are configured, and with `latency_ms == 0` there is no sleep at all, not even `sleep(0)`.

The remembered keys live in this process only: each worker process has its own provider, so
exactly-once across processes cannot be observed here. The chaos tests use the HTTP provider
against one shared receiver for that. Memory grows with one entry per delivered notification,
which is fine for a simulation's lifetime.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Set

from notify_queue.models import DeliveryResult, Outcome
from notify_queue.providers.base import DeliveryRequest


class SimulatedProvider:
    """Counters for tests: `calls` (every deliver), `deliveries` (first-time deliveries only),
    `repeats` (calls for a key already delivered, answered without delivering).

    Exactly-once holds when `deliveries == len(delivered_keys)`: every real delivery was of a
    key not delivered before. `repeats > 0` in a run without crashes means the worker attempted
    a notification it had already completed.
    """

    def __init__(
        self,
        failure_rate: float,
        latency_ms: float,
        timeout_seconds: float,
        rng: random.Random | None = None,
    ) -> None:
        if not 0.0 <= failure_rate <= 1.0:
            raise ValueError("failure_rate must be between 0 and 1")
        if latency_ms < 0 or timeout_seconds < 0:
            raise ValueError("latency_ms and timeout_seconds must not be negative")
        self._failure_rate = failure_rate
        self._latency_seconds = latency_ms / 1000.0
        self._timeout_seconds = timeout_seconds
        self._random = (rng or random.Random()).random
        # Frozen results are safe to share between calls, and sharing them keeps the hot path lean.
        # Like a 503: the simulated provider did not act on the request.
        self._temporary_failure = DeliveryResult(
            Outcome.TEMPORARY_FAILURE, error="simulated temporary failure", nothing_sent=True
        )
        self._permanent_failure = DeliveryResult(
            Outcome.PERMANENT_FAILURE, error="simulated permanent failure: invalid recipient"
        )
        self._timed_out = DeliveryResult(
            Outcome.TEMPORARY_FAILURE, error=f"timed out after {timeout_seconds:g}s"
        )
        # Idempotency key -> the message id of its one delivery. UUIDs, not their strings:
        # hashing the id we already hold costs nothing, formatting it costs an allocation.
        self._message_ids: dict[uuid.UUID, str] = {}
        self.calls = 0
        self.deliveries = 0
        self.repeats = 0

    @property
    def delivered_keys(self) -> Set[uuid.UUID]:
        """The idempotency keys delivered so far (a live view, not a copy)."""
        return self._message_ids.keys()

    def delivery_count(self, key: uuid.UUID) -> int:
        """How many times `key` was really delivered: 0 or 1 while exactly-once holds."""
        return 1 if key in self._message_ids else 0

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        self.calls += 1
        recipient = request.recipient
        if recipient.startswith("invalid"):
            return self._permanent_failure
        if recipient.startswith("timeout"):
            await asyncio.sleep(self._timeout_seconds)
            return self._timed_out
        if self._latency_seconds:
            await asyncio.sleep(self._latency_seconds)
        # From here to the end there is no await: the check and the record of a delivery are one
        # step, so two concurrent attempts with one key cannot both deliver.
        key = request.id
        message_id = self._message_ids.get(key)
        if message_id is not None:
            self.repeats += 1
            return DeliveryResult(Outcome.SENT, provider_message_id=message_id)
        if self._failure_rate and self._random() < self._failure_rate:
            return self._temporary_failure
        message_id = f"sim-{key.hex}"
        self._message_ids[key] = message_id
        self.deliveries += 1
        return DeliveryResult(Outcome.SENT, provider_message_id=message_id)

    async def close(self) -> None:
        """Nothing to release; the remembered keys stay readable for tests after close."""
