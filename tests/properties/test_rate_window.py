"""Rolling-window arithmetic: generated slot histories against the real claim.

For each recipient Hypothesis draws a limit, the ages of the slots already taken (inside and
outside the window) and how many notifications are due now. The claim must admit exactly
`min(due, limit - slots inside the window)` of them, the most urgent first, take a slot for
each, and defer the rest, without using an attempt, to the moment the slot they wait for frees:
the (used - limit + rank)-th oldest slot in the window plus the window, or a full window from now
when that slot is one this very claim takes.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from notify_queue.models import DeliveryResult, Outcome
from notify_queue.repositories.db import Database
from notify_queue.repositories.notifications import NotificationRepository
from tests.properties.conftest import Raw, db_settings
from tests.support import delivery_service, new

WINDOW = 600.0
# Ages this close to the window's edge could fall either side of it between setting up the
# history and the claim's own now(): they are left out, the arithmetic is what is tested. Wide,
# so that even a setup slowed down by a busy machine cannot move a slot across the edge.
EDGE = 60

ages = st.integers(min_value=1, max_value=int(2 * WINDOW)).filter(lambda a: abs(a - WINDOW) > EDGE)
history = st.fixed_dictionaries(
    {
        "slot_ages": st.lists(ages, max_size=12),
        "due": st.integers(min_value=0, max_value=8),
        # Due notifications that already hold a slot of their own, taken `age` seconds ago by an
        # attempt whose worker crashed (inside the window: they are re-checked on that slot).
        "recovered_ages": st.lists(ages, max_size=2),
    }
)


@db_settings(40)
@given(
    histories=st.lists(history, min_size=1, max_size=3), limit=st.integers(min_value=1, max_value=8)
)
async def test_a_claim_admits_exactly_what_the_window_allows_and_defers_the_rest_to_their_slot(
    db: Database, raw: Raw, histories: list[dict[str, list[int] | int]], limit: int
) -> None:
    await raw.reset()
    now = datetime.now(UTC)
    recipients = []
    for i, h in enumerate(histories):
        recipient = f"r{i}-{uuid.uuid4().hex[:8]}@example.com"
        recipients.append(recipient)
        for age in h["slot_ages"]:  # type: ignore[union-attr]
            await _slot(raw, uuid.uuid4(), recipient, age)
        plain = int(h["due"])  # type: ignore[arg-type]
        recovered = list(h["recovered_ages"])  # type: ignore[arg-type]
        batch = [
            new(recipient=recipient, send_at=now - timedelta(seconds=100 - k))
            for k in range(plain + len(recovered))
        ]
        rows = await NotificationRepository(db).notifications_insert(
            notifications=batch, default_max_attempts=6
        )
        # The recovered ones are spread among the others in due order.
        for n, age in zip(rows[::2], recovered, strict=False):
            await _slot(raw, n.id, recipient, age)

    before = await raw.rows(
        "SELECT notification_id, recipient, taken_at FROM nq_rate_window_entries"
    )
    claiming = (await raw.rows("SELECT now() AS t"))[0]["t"]
    service = delivery_service(db, rate_limit=limit, rate_window_seconds=WINDOW)
    result = await service.claim(1000)
    claimed_ids = {c.id for c in result.claimed}
    taken = await raw.rows(
        "SELECT max(taken_at) AS t FROM nq_rate_window_entries"
        " WHERE notification_id = ANY(%(ids)s::uuid[])",
        {"ids": list(claimed_ids)},
    )
    # The claim's own now(): the time of the slots it took; else (nothing admitted) about now.
    claim_time = taken[0]["t"] or (await raw.rows("SELECT now() AS t"))[0]["t"]
    exact = taken[0]["t"] is not None
    horizon = claim_time - timedelta(seconds=WINDOW)

    for recipient in recipients:
        rows = await raw.rows(
            "SELECT n.id, n.status, n.attempt_count, n.next_attempt_at, s.taken_at AS slot_now"
            " FROM nq_all_notifications n"
            " LEFT JOIN nq_rate_window_entries s ON s.notification_id = n.id"
            " WHERE n.recipient = %(r)s ORDER BY n.send_at",
            {"r": recipient},
        )
        own = {b["notification_id"]: b["taken_at"] for b in before if b["recipient"] == recipient}
        in_window = sorted(
            t for b in before if b["recipient"] == recipient and (t := b["taken_at"]) > horizon
        )
        used = len(in_window)  # every slot counts, the recovered rows' own included
        for r in rows:
            r["own_slot"] = own.get(r["id"])
        holders = [r for r in rows if r["own_slot"] is not None and r["own_slot"] > horizon]
        others = [r for r in rows if r not in holders]
        admit = max(0, min(len(others), limit - used))
        expected = {r["id"] for r in holders} | {r["id"] for r in others[:admit]}
        assert {r["id"] for r in rows} & claimed_ids == expected
        for r in rows:
            if r["id"] in expected:
                assert r["status"] == "PROCESSING" and r["attempt_count"] == 1
                assert r["slot_now"] == claim_time  # a slot taken (or renewed) by this claim
        for rank, r in enumerate(others, start=1):
            if rank <= admit:
                continue
            assert r["status"] == "PENDING" and r["attempt_count"] == 0
            index = used - limit + rank - 1
            if index < used:  # waits for that slot of the window to free
                assert r["next_attempt_at"] == in_window[index] + timedelta(seconds=WINDOW)
            else:  # waits for a slot this claim took: a full window from the claim
                due = r["next_attempt_at"] - timedelta(seconds=WINDOW)
                # Without a slot to read it from, the claim's now() lies between two readings.
                assert due == claim_time if exact else claiming <= due <= claim_time


async def _slot(raw: Raw, id: uuid.UUID, recipient: str, age: int) -> None:
    """An entry in the recipient's window (nq_rate_windows, 0012), kept in time order."""
    await raw.rows(
        "INSERT INTO nq_rate_windows AS w (bucket, recipient, ids, taken, last_taken_at)"
        " SELECT nq_bucket(%(r)s), %(r)s, ARRAY[%(id)s::uuid], ARRAY[t], t"
        " FROM (SELECT now() - make_interval(secs => %(age)s) AS t) x"
        " ON CONFLICT (bucket, recipient) DO UPDATE SET"
        " (ids, taken) = (SELECT array_agg(e.id ORDER BY e.t), array_agg(e.t ORDER BY e.t)"
        "   FROM unnest(w.ids || excluded.ids, w.taken || excluded.taken) AS e(id, t)),"
        " last_taken_at = GREATEST(w.last_taken_at, excluded.last_taken_at)",
        {"id": id, "r": recipient, "age": age},
    )


async def test_a_notification_recovered_from_a_crashed_worker_is_not_held_back_by_its_own_slot(
    db: Database, raw: Raw
) -> None:
    """Its crashed attempt's slot already stands for the one delivery this key can make (the
    provider deduplicates the retry), so the re-check must not need a second slot."""
    created = await NotificationRepository(db).notifications_insert(
        notifications=[new(recipient="one@example.com")], default_max_attempts=6
    )
    crashed = delivery_service(db, rate_limit=1, lease_seconds=0.1)
    first = (await crashed.claim(10)).claimed
    assert len(first) == 1
    await raw.rows("UPDATE nq_jobs SET lease_expires_at = now() - interval '1 second'")
    recovered, _ = await _recover(crashed)
    assert recovered == 1
    again = await delivery_service(db, rate_limit=1).claim(10)
    assert [c.id for c in again.claimed] == [created[0].id], "deferred by its own slot"
    _, recorded = await delivery_service(db).complete(
        [(again.claimed[0], DeliveryResult(Outcome.SENT))]
    )
    assert recorded.accepted == {created[0].id}
    slots = await raw.rows("SELECT count(*) AS n FROM nq_rate_window_entries")
    assert slots[0]["n"] == 1


async def _recover(service) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    recovered, dead, _ = await service.housekeeping()
    return recovered, dead
