"""The hash of the request that made a notification is kept once, with its idempotency key
(migrations 0032/0033, docs/performance.md "The drain's CPU, step by step", step 14).

Rows made before the contract step carry their own copy of the hash, rows made after it carry
none (the previous release read that copy, so the expand step leaves it written). Either way a
key seen before answers as CONTRACT section 4 says, whether its row waits in the queue or has
finished: the same request is the original (200), another request is a conflict (409), through
the API's service and through the SQL door (notify_queue_enqueue), whose comparisons read the
key's hash from 0032 on.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from notify_queue.models import NewNotification
from notify_queue.repositories.db import Database
from notify_queue.repositories.schema import migrate
from notify_queue.services.notifications import NotificationService
from tests.support import claim_due, finish, new, notification_service

SQL_DOOR = "SELECT notify_queue_enqueue(%s, %s) ->> 'id'"


def _rows_hash(url: str, id: Any) -> tuple[str | None, str]:
    """The row's own copy of the hash (queue or log) and the key's."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT n.request_hash, k.request_hash FROM nq_all_notifications n"
            " JOIN nq_idempotency_keys k ON k.notification_id = n.id WHERE n.id = %s",
            (id,),
        ).fetchone()
    assert row is not None
    return row[0], row[1]


async def _answers(service: NotificationService, made: NewNotification) -> tuple[bool, bool]:
    """(same request: the original, another request: a conflict) for a key seen before."""
    again = dataclasses.replace(made, body="ignored")
    changed = dataclasses.replace(made, request_hash=made.request_hash + "!")
    same = (await service.enqueue_many([again]))[0]
    other = (await service.enqueue_many([changed]))[0]
    return (not same.created and not same.conflict, other.conflict)


def _door(url: str, key: str, body: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            SQL_DOOR, [Jsonb({"channel": "sms", "recipient": "+4915112345678", "body": body}), key]
        ).fetchone()
    assert row is not None
    return str(row[0])


async def test_rows_made_before_and_after_the_contract_answer_a_key_seen_before(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    async with Database(url, pool_size=2) as db:
        service = notification_service(db, announce=False)
        await migrate(db, target=31)
        before = new()
        (made,) = await service.enqueue_many([before])
        door_before = _door(url, "door-before", "hello")
        assert _rows_hash(url, made.notification.id) == (before.request_hash,) * 2

        assert await migrate(db) == [32]
        expanded = new()
        (made_expanded,) = await service.enqueue_many([expanded])
        # The previous release still reads the rows' copy: written until the contract step.
        assert _rows_hash(url, made_expanded.notification.id) == (expanded.request_hash,) * 2

        assert await migrate(db, contract=True) == [33, 34]
        after = new()
        (made_after,) = await service.enqueue_many([after])
        door_after = _door(url, "door-after", "hello")
        assert _rows_hash(url, made_after.notification.id) == (None, after.request_hash)
        assert _rows_hash(url, door_after)[0] is None

        for made in (before, expanded, after):
            assert await _answers(service, made) == (True, True)
        # Finished: the row in the log, the key's hash still the one compared.
        await finish(db, await claim_due(db, 5))
        for made in (before, expanded, after):
            assert await _answers(service, made) == (True, True)

        for key, id in (("door-before", door_before), ("door-after", door_after)):
            assert _door(url, key, "hello") == id
            with pytest.raises(psycopg.errors.UniqueViolation, match="different request"):
                _door(url, key, "another")
