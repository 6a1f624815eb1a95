"""No sequence of preference changes and sends ever delivers on an opted-out channel.

Hypothesis draws a history of steps for one recipient: preference changes (channels, categories,
everything opted out or back in), user-targeted sends (a category, a channel order, a strategy)
and delivery rounds (a real claim, then each claimed notification recorded as SENT, as a worker
would after its provider answered). The model is simply the current preferences: whatever a
claim hands out for delivery must be allowed by them at that moment, and whatever a send creates
as PENDING must be allowed at creation. Runs against the real schema and claim.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from notify_queue.models import Channel, DeliveryResult, Outcome, Status
from notify_queue.repositories.db import Database
from notify_queue.repositories.notifications import NotificationRepository
from notify_queue.repositories.recipients import RecipientRepository
from notify_queue.services.notifications import NotificationService
from notify_queue.services.recipients import RecipientService
from notify_queue.services.validation import parse_request, prepare_request, request_hash
from tests.properties.conftest import Raw, db_settings
from tests.support import delivery_service

CATEGORIES = ["transactional", "marketing", "news"]
CHANNELS = [c.value for c in Channel]

preference_change = st.fixed_dictionaries(
    {},
    optional={
        "channels": st.lists(st.sampled_from(CHANNELS), unique=True),
        "categories": st.lists(st.sampled_from(CATEGORIES), unique=True),
        "all": st.booleans(),
    },
).map(lambda opt_out: ("prefs", opt_out))
send = st.tuples(
    st.just("send"),
    st.fixed_dictionaries(
        {"category": st.sampled_from(CATEGORIES)},
        optional={
            "channels": st.lists(st.sampled_from(CHANNELS), unique=True, min_size=1),
            "strategy": st.sampled_from(["all", "first"]),
        },
    ),
)
deliver = st.just(("deliver", {}))
steps = st.lists(st.one_of(preference_change, send, deliver), min_size=1, max_size=12)


def allowed(model: dict[str, Any], channel: str, category: str) -> bool:
    return not (model["all"] or channel in model["channels"] or category in model["categories"])


@db_settings(25)
@given(history=steps)
async def test_no_history_delivers_on_an_opted_out_channel_or_category(
    db: Database, raw: Raw, history: list[tuple[str, dict[str, Any]]]
) -> None:
    await raw.reset()
    await raw.conn.execute("TRUNCATE nq_recipients, nq_templates")
    recipients = RecipientService(RecipientRepository(db))
    notifications = NotificationService(NotificationRepository(db), default_max_attempts=3)
    delivery = delivery_service(db, rate_limit=1000)
    await recipients.put(
        "p", {"email": "p@example.com", "phone": "+4915112345678", "pushTokens": ["t"]}
    )
    model: dict[str, Any] = {"channels": set(), "categories": set(), "all": False}
    delivered = 0
    for kind, args in [*history, ("deliver", {})]:
        if kind == "prefs":
            await recipients.merge_preferences("p", {"optOut": args})
            model["channels"] = set(args.get("channels", model["channels"]))
            model["categories"] = set(args.get("categories", model["categories"]))
            model["all"] = args.get("all", model["all"])
        elif kind == "send":
            data = {"recipientId": "p", "body": "x", **args}
            prepared = prepare_request(
                parse_request(data),
                idempotency_key=uuid.uuid4().hex,
                request_digest=request_hash(data),
                now=datetime.now(UTC),
            )
            (result,) = await notifications.create_many([prepared])
            assert not isinstance(result, Exception)
            for n in result.notifications:
                if n.status is Status.PENDING:
                    assert allowed(model, n.channel.value, n.category), (n, model)
                else:
                    assert n.status is Status.SUPPRESSED
        else:
            batch = await delivery.claim(100)
            for claimed in batch.claimed:
                assert allowed(model, claimed.channel.value, claimed.category), (claimed, model)
            await delivery.complete([(c, DeliveryResult(Outcome.SENT)) for c in batch.claimed])
            delivered += len(batch.claimed)
    # Nothing is left behind unexamined: every notification ended SENT or SUPPRESSED.
    rows = await raw.rows("SELECT status, count(*) AS n FROM nq_all_notifications GROUP BY status")
    assert {r["status"] for r in rows} <= {"SENT", "SUPPRESSED"}
    assert sum(r["n"] for r in rows if r["status"] == "SENT") == delivered
