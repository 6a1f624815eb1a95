"""Priority order: a model of the claim order against the real claim on PostgreSQL.

Hypothesis draws a queue (priorities, due times in the past or future, creation times, expiry,
channels), the lanes a worker serves and its claim size. The model says which rows a claim must
take and in which order: due, unexpired, in the worker's lanes and channels, then HIGH before
NORMAL before LOW, longest due first, oldest created first, at most the claim size. The real
claim must take exactly those, in exactly that order, and leave every other row alone.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from notify_queue.models import Channel, Priority
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery import DeliveryRepository
from notify_queue.repositories.notifications import NotificationRepository
from notify_queue.services.delivery import DeliveryService
from tests.properties.conftest import Raw, db_settings
from tests.support import defaults, new

row = st.fixed_dictionaries(
    {
        "priority": st.sampled_from(list(Priority)),
        "channel": st.sampled_from(list(Channel)),
        # Due times on a coarse grid, so ties on next_attempt_at happen and created_at decides.
        "due_seconds_ago": st.integers(min_value=-5, max_value=8).map(lambda n: n * 60),
        "created_seconds_ago": st.integers(min_value=0, max_value=10_000),
        "expired": st.sampled_from([False, False, False, True]),
    }
)


@db_settings(40)
@given(
    rows=st.lists(row, min_size=0, max_size=14, unique_by=lambda r: r["created_seconds_ago"]),
    lanes=st.sets(st.sampled_from(list(Priority)), min_size=1),
    channels=st.sets(st.sampled_from(list(Channel)), min_size=1),
    limit=st.integers(min_value=1, max_value=16),
)
async def test_a_claim_takes_exactly_the_rows_the_order_model_says_in_that_order(
    db: Database,
    raw: Raw,
    rows: list[dict[str, object]],
    lanes: set[Priority],
    channels: set[Channel],
    limit: int,
) -> None:
    await raw.reset()
    inserted = await NotificationRepository(db).notifications_insert(
        notifications=[new(priority=r["priority"], channel=r["channel"]) for r in rows],  # type: ignore[arg-type]
        default_max_attempts=6,
    )
    by_key = {n.idempotency_key: n.id for n in inserted}
    now = datetime.now(UTC)
    model = []
    for spec, n in zip(rows, inserted, strict=True):
        due = now - timedelta(seconds=spec["due_seconds_ago"])  # type: ignore[arg-type]
        created = now - timedelta(seconds=spec["created_seconds_ago"] + 60)  # type: ignore[operator]
        expires = now - timedelta(seconds=1) if spec["expired"] else None
        await raw.rows(
            "UPDATE nq_jobs SET next_attempt_at = %(due)s, created_at = %(created)s,"
            " expires_at = %(expires)s WHERE id = %(id)s",
            {"due": due, "created": created, "expires": expires, "id": n.id},
        )
        model.append((n.priority.rank, due, created, n.id, n.channel, spec))
    assert len(by_key) == len(rows)

    service = DeliveryService(
        DeliveryRepository(db, defaults(rate_limit=1_000_000)),
        priorities=sorted(lanes, key=lambda p: p.rank),
        channels=sorted(channels),
    )
    claimed = (await service.claim(limit)).claimed

    # A row due a few milliseconds from now is not due; the grid keeps every due time a minute
    # or more from `now`, so the model and the database agree on what is due.
    eligible = sorted(
        (
            m
            for m in model
            if m[1] <= now
            and not m[5]["expired"]
            and Priority.from_rank(m[0]) in lanes
            and m[4] in channels
        ),
        key=lambda m: (m[0], m[1], m[2]),
    )
    expected = [m[3] for m in eligible[:limit]]
    assert [c.id for c in claimed] == expected
    untouched = await raw.rows(
        "SELECT count(*) AS n FROM nq_all_notifications"
        " WHERE status = 'PENDING' AND attempt_count = 0"
    )
    assert untouched[0]["n"] == len(rows) - len(expected)
