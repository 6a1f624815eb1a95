"""The hash of the request that made a notification is kept once, with its idempotency key
(migrations 0032/0033, docs/performance.md "The drain's CPU, step by step", step 14), and as its
first 16 bytes (0035/0036, step 17).

Rows made before the contract step 0033 carry their own copy of the hash, rows made after it
carry none (the previous release read that copy, so the expand step leaves it written). Keys made
before the contract step 0036 keep the hash as 64 hex characters (the previous release compared
that form, so the expand step 0035 leaves it written), keys made after it as 16 bytes. Either way
a key seen before answers as CONTRACT section 4 says, whether its row waits in the queue or has
finished: the same request is the original (200), another request is a conflict (409), through
the API's service and through the SQL door (notify_queue_enqueue), whose comparisons read the
key's hash from 0032 on, in either form from 0035 on.
"""

from __future__ import annotations

import dataclasses
import hashlib
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


def _rows_hash(url: str, id: Any) -> tuple[str | None, str | None]:
    """The row's own copy of the hash (queue or log) and the key's hex form."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT n.request_hash, k.request_hash FROM nq_all_notifications n"
            " JOIN nq_idempotency_keys k ON k.notification_id = n.id WHERE n.id = %s",
            (id,),
        ).fetchone()
    assert row is not None
    return row[0], row[1]


def _key_digest(url: str, id: Any) -> bytes | None:
    """The key's 16-byte form (0035 on), None where the key has the hex form only."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT request_digest FROM nq_idempotency_keys WHERE notification_id = %s", (id,)
        ).fetchone()
    assert row is not None
    return None if row[0] is None else bytes(row[0])


async def _answers(service: NotificationService, made: NewNotification) -> tuple[bool, bool]:
    """(same request: the original, another request: a conflict) for a key seen before."""
    again = dataclasses.replace(made, body="ignored")
    changed = dataclasses.replace(made, request_hash=hashlib.sha256(b"another").hexdigest())
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

        assert await migrate(db, target=32) == [32]
        expanded = new()
        (made_expanded,) = await service.enqueue_many([expanded])
        # The previous release still reads the rows' copy: written until the contract step.
        assert _rows_hash(url, made_expanded.notification.id) == (expanded.request_hash,) * 2

        assert await migrate(db, target=34, contract=True) == [33, 34]
        after = new()
        (made_after,) = await service.enqueue_many([after])
        door_after = _door(url, "door-after", "hello")
        assert _rows_hash(url, made_after.notification.id) == (None, after.request_hash)
        assert _rows_hash(url, door_after)[0] is None

        # The hash as 16 bytes: expand (both forms written), then contract (the short one only).
        assert await migrate(db) == [35, 37, 38, 39, 40, 41, 42, 43, 44, 45, 48, 49, 52, 53, 65]
        both = new()
        (made_both,) = await service.enqueue_many([both])
        door_both = _door(url, "door-both", "hello")
        assert _rows_hash(url, made_both.notification.id) == (None, both.request_hash)
        assert _key_digest(url, made_both.notification.id) is None
        assert await migrate(db, contract=True) == [36]
        short = new()
        (made_short,) = await service.enqueue_many([short])
        door_short = _door(url, "door-short", "hello")
        assert _rows_hash(url, made_short.notification.id) == (None, None)
        assert _key_digest(url, made_short.notification.id) == bytes.fromhex(
            short.request_hash[:32]
        )
        assert _rows_hash(url, door_short) == (None, None)

        for made in (before, expanded, after, both, short):
            assert await _answers(service, made) == (True, True)
        # Finished: the row in the log, the key's hash still the one compared.
        await finish(db, await claim_due(db, 5))
        for made in (before, expanded, after, both, short):
            assert await _answers(service, made) == (True, True)

        for key, id in (
            ("door-before", door_before),
            ("door-after", door_after),
            ("door-both", door_both),
            ("door-short", door_short),
        ):
            assert _door(url, key, "hello") == id
            with pytest.raises(psycopg.errors.UniqueViolation, match="different request"):
                _door(url, key, "another")
