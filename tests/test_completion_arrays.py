"""A completion's columns that are NULL (or false) for every result of its batch are sent as one
NULL instead of an array (repositories/delivery.py, `_nulls_as_null` and `_flags`): the functions
read their arrays through one multi-argument `unnest`, which pads a NULL array with NULLs, and use
a flag only as `CASE WHEN` or `WHERE`. Shown on the real functions: rows that had an earlier
attempt's error and binding, finished SENT, are stored alike whether the batch's empty columns
went as arrays (the negative control's shape, as before) or as NULLs."""

from __future__ import annotations

import psycopg
import pytest

from notify_queue.models import ClaimedNotification, Completion, Status
from notify_queue.repositories import delivery
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery import DeliveryRepository
from tests.support import claim_due, claim_new, defaults

ROWS = 8


def _sent(claimed: list[ClaimedNotification]) -> list[Completion]:
    return [
        Completion(c.id, c.claim_token, Status.SENT, None, None, "m-sent", "log") for c in claimed
    ]


async def test_a_batch_of_sent_results_is_stored_alike_with_its_empty_columns_as_null(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Database(database_url, pool_size=1, name="notify-queue-worker") as db:
        repository = DeliveryRepository(db, defaults(rate_limit=1_000))
        # A first attempt each: a temporary failure, due again at once, bound to its provider.
        first = await claim_new(db, ROWS)
        retries = [
            Completion(
                c.id, c.claim_token, Status.PENDING, 0.0, "busy", None, "log", bound_provider="log"
            )
            for c in first
        ]
        assert (await repository.deliveries_complete(completions=retries)).accepted == {
            c.id for c in first
        }
        claimed = await claim_due(db, ROWS)
        as_arrays, as_nulls = claimed[: ROWS // 2], claimed[ROWS // 2 :]

        with monkeypatch.context() as m:
            m.setattr(delivery, "_nulls_as_null", lambda values: values)
            m.setattr(delivery, "_flags", lambda values: values)
            recorded = await repository.deliveries_complete(completions=_sent(as_arrays))
        assert recorded.accepted == {c.id for c in as_arrays}
        recorded = await repository.deliveries_complete(completions=_sent(as_nulls))
        assert recorded.accepted == {c.id for c in as_nulls}

    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT id, status, last_error, attempt_count, provider, provider_message_id,"
            " waiting_reason, waiting_detail, jsonb_array_length(delivery_attempts)"
            " FROM nq_all_notifications"
        ).fetchall()
    stored = {r[0]: r[1:] for r in rows}
    first_kind = {stored[c.id] for c in as_arrays}
    assert first_kind == {("SENT", None, 2, "log", "m-sent", None, None, 0)}
    assert {stored[c.id] for c in as_nulls} == first_kind


def test_only_columns_empty_for_the_whole_batch_go_as_null() -> None:
    assert delivery._nulls_as_null([None, None]) is None
    assert delivery._nulls_as_null([None, "busy"]) == [None, "busy"]
    assert delivery._flags([False, False]) is None
    assert delivery._flags([False, True]) == [False, True]
