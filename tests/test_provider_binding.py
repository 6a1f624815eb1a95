"""The provider a notification's attempt is bound to (the row's `provider` while unfinished),
and the probe handed back, against the real statements: the claim binds an unbound row to its
chain's head and reports an earlier binding as sticky; a completion keeps or clears it; only the
claim's holder may rebind; a lost lease keeps it and so does an operator's retry; a probe taken
and handed back is taken again at once.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from notify_queue.models import (
    Channel,
    ClaimedNotification,
    DeliveryResult,
    Failover,
    Outcome,
    Policy,
    Status,
)
from notify_queue.providers.specs import ProviderSpecs
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery import ChainHeads
from notify_queue.repositories.notifications import NotificationRepository
from notify_queue.repositories.policies import PolicyRepository
from notify_queue.repositories.providers import CircuitReport, ProviderRepository
from notify_queue.services.delivery import DeliveryService
from notify_queue.worker.routing import Router
from tests.chaos.harness import read_rows
from tests.support import delivery_service, new, notification_service

HEADS = ChainHeads({Channel.EMAIL: "a", Channel.SMS: "a", Channel.PUSH: "a"}, ("a", "b"))


async def _claim_one(service: DeliveryService) -> ClaimedNotification:
    batch = await service.claim(10, chain_heads=HEADS)
    [claimed] = batch.claimed
    return claimed


async def _bound(db: Database, id_: uuid.UUID) -> str | None:
    async with db.connection() as conn:
        row = await conn.fetch_one("notification_get", {"id": id_})
    assert row is not None
    return row["provider"]  # type: ignore[no-any-return]


async def _retry_now(
    service: DeliveryService, claimed: ClaimedNotification, bound: str | None
) -> None:
    result = DeliveryResult(Outcome.TEMPORARY_FAILURE, error="timeout", bound_provider=bound)
    completions, recorded = await service.complete([(claimed, result)])
    assert recorded.accepted == {claimed.id} and completions[0].status is Status.PENDING


async def test_a_claim_binds_to_the_chain_head_and_an_unknown_outcome_makes_the_binding_sticky(
    db: Database,
) -> None:
    [made] = await notification_service(db).enqueue_many([new()])
    service = delivery_service(db, backoff_base_seconds=0.0, backoff_max_seconds=0.0)
    first = await _claim_one(service)
    assert (first.bound_provider, first.sticky_provider) == ("a", None)
    assert await _bound(db, made.notification.id) == "a"

    await _retry_now(service, first, "a")  # a timeout at a: the outcome is unknown
    second = await _claim_one(service)
    assert (second.bound_provider, second.sticky_provider) == ("a", "a")

    await _retry_now(service, second, None)  # an answer proving nothing was sent
    third = await _claim_one(service)
    assert (third.bound_provider, third.sticky_provider) == ("a", None)


async def test_a_policy_chain_binds_to_its_first_provider_this_worker_knows(db: Database) -> None:
    await PolicyRepository(db).policy_upsert(
        policy=Policy(name="ns/p", providers=("elsewhere", "b", "a")), ready=True
    )
    await notification_service(db).enqueue_many([new(policy="ns/p")])
    claimed = await _claim_one(delivery_service(db))
    assert claimed.bound_provider == "b"


async def test_only_the_claims_holder_can_rebind_a_row(db: Database) -> None:
    [made] = await notification_service(db).enqueue_many([new()])
    claimed = await _claim_one(delivery_service(db))
    providers = ProviderRepository(db)
    assert not await providers.notification_bind_provider(
        id=claimed.id, claim_token=uuid.uuid4(), provider="b"
    )
    assert await _bound(db, made.notification.id) == "a"
    assert await providers.notification_bind_provider(
        id=claimed.id, claim_token=claimed.claim_token, provider="b"
    )
    assert await _bound(db, made.notification.id) == "b"


async def test_a_lost_lease_and_an_operators_retry_keep_the_binding(
    db: Database,
) -> None:
    [made] = await notification_service(db).enqueue_many([new()])
    service = delivery_service(db, lease_seconds=0.0, backoff_base_seconds=0.0)
    claimed = await _claim_one(service)
    await ProviderRepository(db).notification_bind_provider(
        id=claimed.id, claim_token=claimed.claim_token, provider="b"
    )
    # The worker dies during its call to b: the lease runs out and the row is recovered.
    recovered, _, _ = await service.housekeeping()
    assert recovered == 1
    again = await _claim_one(service)
    assert again.sticky_provider == "b"
    # Dead-lettered while bound to b, then retried by an operator: b may have delivered it, so
    # the retried notification still goes to b only (the retry moves `provider` with the row).
    last = replace(again, attempt_count=again.max_attempts)
    result = DeliveryResult(Outcome.TEMPORARY_FAILURE, error="timeout", bound_provider="b")
    [completion], _ = await service.complete([(last, result)])
    assert completion.status is Status.DEAD_LETTERED
    assert await NotificationRepository(db).notification_retry(id=made.notification.id)
    assert await _bound(db, made.notification.id) == "b"
    retried = await _claim_one(service)
    assert retried.sticky_provider == "b"


async def test_a_probe_handed_back_is_taken_again_at_once(db: Database) -> None:
    providers = ProviderRepository(db)
    await providers.provider_rows_ensure(limited=[], breakers=["a"])
    # One failure against a threshold of one, with no cool-down: open, probe due now.
    await providers.provider_circuits_record(
        reports=[CircuitReport("a", False, 1, threshold=1, open_for_seconds=0.0)]
    )
    token = await providers.provider_circuit_take_probe(provider="a", probe_seconds=60)
    assert token is not None
    assert await providers.provider_circuit_take_probe(provider="a", probe_seconds=60) is None
    # Only the probe's own token hands it back.
    await providers.provider_circuit_return_probe(provider="a", probe_token=uuid.uuid4())
    assert await providers.provider_circuit_take_probe(provider="a", probe_seconds=60) is None
    await providers.provider_circuit_return_probe(provider="a", probe_token=token)
    assert await providers.provider_circuit_take_probe(provider="a", probe_seconds=60) is not None


class _NeverCalled:
    calls = 0

    async def deliver(self, request: object) -> DeliveryResult:
        self.calls += 1
        return DeliveryResult(Outcome.SENT, provider_message_id="m")


async def test_a_delivery_that_takes_the_probe_but_gets_no_send_slot_hands_the_probe_back(
    db: Database,
) -> None:
    """Negative control, by hand: without `Circuits.give_back` the second take finds the probe
    still out (until its timeout) and this test fails."""
    specs = ProviderSpecs.model_validate(
        {
            "providers": [
                {
                    "name": "a",
                    "type": "simulated",
                    "channels": list(Channel),
                    "rateLimit": {"perSecond": 1},
                    "circuitBreaker": {"failures": 1, "openFor": "1s"},
                }
            ]
        }
    )
    provider = _NeverCalled()
    providers = ProviderRepository(db)
    router = Router(
        specs,
        {"a": provider},
        providers,
        failover=Failover.ON_DEFINITE_FAILURE,
        wait_bound_seconds=0.5,
    )
    await router.start()
    # The circuit open and its cool-down over (the probe is due); the schedule full for an hour.
    await providers.provider_circuits_record(
        reports=[CircuitReport("a", False, 1, threshold=1, open_for_seconds=0.0)]
    )
    await read_rows(
        db,
        "UPDATE nq_provider_schedule SET next_free = now() + interval '1 hour'"
        " WHERE provider = 'a' RETURNING provider",
    )
    await router.circuits.refresh()
    await notification_service(db).enqueue_many([new()])
    claimed = await _claim_one(delivery_service(db))

    result = await router.deliver(claimed)
    assert result.outcome is Outcome.PROVIDER_LIMITED and provider.calls == 0
    # The probe this delivery took is free again at once: another delivery can take it.
    assert await providers.provider_circuit_take_probe(provider="a", probe_seconds=60) is not None
