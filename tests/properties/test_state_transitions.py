"""State transitions: random sequences of every operation the SQL offers, against a model.

Hypothesis draws sequences of claims, completions (sent, temporary and permanent failures, from
the current holder or from a stale claim), graceful hand-backs, cancels, operator retries (one
and in bulk), expiry, lease expiry and the passing of time, and runs them against the real
queries on PostgreSQL. After every step the database must match a model of CONTRACT section 3:

- no path leaves a final state, except an operator retry from FAILED or DEAD_LETTERED;
- a result is accepted only from the current claim (a stale token changes nothing);
- attempts count at the claim, come back on a hand-back, reset on a retry, and never pass
  max_attempts + 1 (the final re-check after a crash on the last attempt);
- PROCESSING rows, and only they, carry a claim token and a lease; final rows, and only they,
  a finish time; PROCESSING and SENT rows hold a rate-limit slot;
- every move into SENT, FAILED, DEAD_LETTERED or EXPIRED wrote exactly one webhook event.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from notify_queue.models import ClaimedNotification, DeliveryResult, Outcome, Status
from notify_queue.repositories.db import Database
from notify_queue.services.delivery import DeliveryService
from tests.properties.conftest import Raw, db_settings
from tests.support import delivery_service, new, notification_service

MAX_ATTEMPTS = 2
COUNT = 3
FINAL = {"SENT", "FAILED", "DEAD_LETTERED", "CANCELLED", "EXPIRED"}
REPORTED = {"SENT", "FAILED", "DEAD_LETTERED", "EXPIRED"}
RESULTS = {
    "sent": DeliveryResult(Outcome.SENT, provider_message_id="m"),
    "temporary": DeliveryResult(Outcome.TEMPORARY_FAILURE, error="503"),
    "permanent": DeliveryResult(Outcome.PERMANENT_FAILURE, error="400"),
}
# The moves each operation may make; anything else is a bug. Final states have no way out but
# the operator's retry.
ALLOWED = {
    "claim": {("PENDING", "PROCESSING")},
    "complete": {("PROCESSING", s) for s in ("SENT", "FAILED", "DEAD_LETTERED", "PENDING")},
    "release": {("PROCESSING", "PENDING")},
    "cancel": {("PENDING", "CANCELLED")},
    "retry": {("FAILED", "PENDING"), ("DEAD_LETTERED", "PENDING")},
    "retry_batch": {("FAILED", "PENDING"), ("DEAD_LETTERED", "PENDING")},
    "expire": {("PENDING", "EXPIRED")},
    # Housekeeping recovers expired leases and then expires what is overdue, so a recovered
    # notification whose expiry passed goes on to EXPIRED within the same step.
    "lease_expire": {
        ("PROCESSING", "PENDING"),
        ("PROCESSING", "DEAD_LETTERED"),
        ("PROCESSING", "EXPIRED"),
        ("PENDING", "EXPIRED"),
    },
    "advance": set(),
}

index = st.integers(min_value=0, max_value=COUNT - 1)
# Which claim a completion or hand-back uses, counted from the newest: mostly the newest (the
# current holder), sometimes an older one (a stale token).
held = st.integers(min_value=0, max_value=3)
PARAMETERS = {
    "claim": st.tuples(st.integers(min_value=1, max_value=COUNT)),
    "complete": st.tuples(held, st.sampled_from(sorted(RESULTS))),
    "release": st.tuples(held),
    "cancel": st.tuples(index),
    "retry": st.tuples(index),
    "retry_batch": st.tuples(
        st.sampled_from(["FAILED", "DEAD_LETTERED"]), st.integers(min_value=1, max_value=COUNT)
    ),
    "expire": st.tuples(index),
    "lease_expire": st.tuples(index),
    "advance": st.tuples(),
}
# Claims, completions and the passing of time are drawn more often than the rest (cancel and
# expiry end a notification's story), so that sequences reach the later attempts, the
# dead-letter queue, operator retries and the final re-check after a lost lease.
KINDS = (
    ["claim"] * 4
    + ["complete"] * 5
    + ["advance"] * 3
    + ["lease_expire"] * 2
    + ["retry"] * 2
    + ["release", "retry_batch", "cancel", "expire"]
)
operation = st.sampled_from(KINDS).flatmap(lambda k: PARAMETERS[k].map(lambda p: (k, *p)))
operations = st.lists(operation, min_size=20, max_size=50)


@dataclass
class Model:
    status: str = "PENDING"
    attempts: int = 0
    token: uuid.UUID | None = None
    due: bool = True
    expired: bool = False
    events: int = 0
    retries: int = 0


@dataclass
class World:
    ids: list[uuid.UUID]
    order: list[uuid.UUID]  # (created_at, id): the order of bulk retries
    model: dict[uuid.UUID, Model]
    claims: list[ClaimedNotification] = field(default_factory=list)

    def move(self, id: uuid.UUID, status: str) -> None:
        m = self.model[id]
        if status in REPORTED:
            m.events += 1
        m.status = status
        if status != "PROCESSING":
            m.token = None


@db_settings(40)
@given(ops=operations)
async def test_no_sequence_of_operations_leaves_a_final_state_or_breaks_an_invariant(
    db: Database, raw: Raw, ops: list[tuple[object, ...]]
) -> None:
    await raw.reset()
    notifications = notification_service(db, max_attempts=MAX_ATTEMPTS)
    # Backoff of 10+ minutes: a temporarily failed notification is due again only when the
    # sequence says time passes ("advance"), so the model knows what is due.
    service = delivery_service(
        db,
        rate_limit=1_000,
        backoff_base_seconds=600.0,
        backoff_max_seconds=1000.0,
        webhook_url="http://hooks.example/x",
    )
    created = await notifications.enqueue_many(
        [new(send_at=datetime.now(UTC) - timedelta(seconds=5)) for _ in range(COUNT)]
    )
    ids = [c.notification.id for c in created]
    order = [
        r["id"]
        for r in await raw.rows("SELECT id FROM nq_all_notifications ORDER BY created_at, id")
    ]
    world = World(ids, order, {i: Model() for i in ids})

    for step, op in enumerate(ops):
        before = await _snapshot(raw)
        await _apply(op, world, service, notifications, raw)
        after = await _snapshot(raw)
        where = f"step {step}: {op} in {ops}"
        for id in ids:
            old, new_ = before[id]["status"], after[id]["status"]
            if old != new_:
                assert (old, new_) in ALLOWED[str(op[0])], f"{old} -> {new_} at {where}"
            _check_row(after[id], world.model[id], where)


async def _apply(
    op: tuple[object, ...],
    world: World,
    service: DeliveryService,
    notifications,
    raw: Raw,  # type: ignore[no-untyped-def]
) -> None:
    kind = op[0]
    model = world.model
    if kind == "claim":
        limit = int(op[1])  # type: ignore[call-overload]
        eligible = {
            i for i, m in model.items() if m.status == "PENDING" and m.due and not m.expired
        }
        batch = await service.claim(limit)
        got = {c.id for c in batch.claimed}
        assert got <= eligible and len(got) == min(limit, len(eligible)) and not batch.rate_limited
        for c in batch.claimed:
            m = model[c.id]
            world.move(c.id, "PROCESSING")
            m.attempts += 1
            m.token = c.claim_token
            assert c.attempt_count == m.attempts
            world.claims.append(c)
    elif kind in ("complete", "release"):
        if not world.claims:
            return
        claim = world.claims[-1 - int(op[1]) % len(world.claims)]  # type: ignore[call-overload]
        m = model[claim.id]
        current = m.status == "PROCESSING" and m.token == claim.claim_token
        if kind == "release":
            released = await service.release([claim])
            assert released == (1 if current else 0)
            if current:
                world.move(claim.id, "PENDING")
                m.attempts -= 1
                m.due = True
            return
        result = RESULTS[str(op[2])]
        _, recorded = await service.complete([(claim, result)])
        assert recorded.accepted == ({claim.id} if current else set())
        if current:
            if result.outcome is Outcome.SENT:
                world.move(claim.id, "SENT")
            elif result.outcome is Outcome.PERMANENT_FAILURE:
                world.move(claim.id, "FAILED")
            elif claim.attempt_count >= MAX_ATTEMPTS:
                world.move(claim.id, "DEAD_LETTERED")
            else:
                world.move(claim.id, "PENDING")
                m.due = False
    elif kind == "cancel":
        id = world.ids[int(op[1])]  # type: ignore[call-overload]
        cancelled = await notifications._repository.notification_cancel(id=id)
        assert (cancelled is not None) == (model[id].status == "PENDING")
        if cancelled is not None:
            world.move(id, "CANCELLED")
    elif kind == "retry":
        id = world.ids[int(op[1])]  # type: ignore[call-overload]
        retried = await notifications._repository.notification_retry(id=id)
        assert (retried is not None) == (model[id].status in ("FAILED", "DEAD_LETTERED"))
        if retried is not None:
            _retried(world, id)
    elif kind == "retry_batch":
        status, limit = str(op[1]), int(op[2])  # type: ignore[call-overload]
        candidates = [i for i in world.order if model[i].status == status]
        retried, remaining = await notifications.retry_batch(status=Status(status), limit=limit)
        assert (retried, remaining) == (
            min(limit, len(candidates)),
            max(len(candidates) - limit, 0),
        )
        for id in candidates[:limit]:
            _retried(world, id)
    elif kind == "expire":
        id = world.ids[int(op[1])]  # type: ignore[call-overload]
        # The deadline passes wherever the row is: a finished one keeps it if it is retried.
        for table in ("nq_jobs", "nq_delivery_log"):
            await raw.rows(
                f"UPDATE {table} SET expires_at = now() - interval '1 second'"  # noqa: S608
                " WHERE id = %(id)s",
                {"id": id},
            )
        model[id].expired = True
        await service.housekeeping()
        for i, m in model.items():
            if m.status == "PENDING" and m.expired:
                world.move(i, "EXPIRED")
    elif kind == "lease_expire":
        id = world.ids[int(op[1])]  # type: ignore[call-overload]
        await raw.rows(
            "UPDATE nq_jobs SET lease_expires_at = now() - interval '1 second'"
            " WHERE id = %(id)s AND status = 'PROCESSING'",
            {"id": id},
        )
        await service.housekeeping()
        m = model[id]
        if m.status == "PROCESSING":
            world.move(id, "DEAD_LETTERED" if m.attempts > MAX_ATTEMPTS else "PENDING")
            m.due = True
        for i, other in model.items():  # housekeeping also expires what is overdue
            if other.status == "PENDING" and other.expired:
                world.move(i, "EXPIRED")
    elif kind == "advance":
        await raw.rows(
            "UPDATE nq_jobs"
            " SET next_attempt_at = next_attempt_at - interval '2000 seconds'"
            " WHERE status = 'PENDING'"
        )
        for m in model.values():
            if m.status == "PENDING":
                m.due = True


def _retried(world: World, id: uuid.UUID) -> None:
    m = world.model[id]
    world.move(id, "PENDING")
    m.attempts = 0
    m.due = True
    m.retries += 1


async def _snapshot(raw: Raw) -> dict[uuid.UUID, dict[str, object]]:
    rows = await raw.rows(
        "SELECT n.id, n.status, n.attempt_count, n.claim_token, n.lease_expires_at, n.finished_at,"
        " jsonb_array_length(n.retries) AS retries,"
        " (SELECT count(*) FROM nq_webhook_events e WHERE e.notification_id = n.id) AS events,"
        " EXISTS (SELECT 1 FROM nq_rate_window_entries s WHERE s.notification_id = n.id) AS slot"
        " FROM nq_all_notifications n"
    )
    return {r["id"]: r for r in rows}


def _check_row(row: dict[str, object], m: Model, where: str) -> None:
    status = row["status"]
    assert (status, row["attempt_count"]) == (m.status, m.attempts), f"{row} vs {m} at {where}"
    assert 0 <= m.attempts <= MAX_ATTEMPTS + 1
    processing = status == "PROCESSING"
    assert (row["claim_token"] is not None) == processing, where
    assert (row["lease_expires_at"] is not None) == processing, where
    if processing:
        assert row["claim_token"] == m.token, where
    assert (row["finished_at"] is not None) == (status in FINAL), where
    if status in ("PROCESSING", "SENT"):
        assert row["slot"], f"{status} without a rate-limit slot at {where}"
    assert row["events"] == m.events, (
        f"{row['events']} webhook events, expected {m.events} at {where}"
    )
    assert row["retries"] == m.retries, where
