"""The hash of the request that made a notification is kept once, with its idempotency key, as its
first 16 bytes (migrations 0032-0036). Keys and rows written by an earlier release keep the forms
they were written in (a copy in the row before 0033, 64 hex characters before 0036); each answers a
key seen before as the API says, whether its row waits in the queue or has finished: the same
request is the original (200), another request is a conflict (409), through the API's service and
through the SQL door (notify_queue_enqueue).
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


def _as_before_the_contracts(url: str, id: Any, request_hash: str, *, row_copy: bool) -> None:
    """The key (and, with `row_copy`, the row) as a release before 0036 (0033) wrote them: the
    hash as 64 hex characters, no 16-byte form."""
    with psycopg.connect(url) as conn:
        conn.execute(
            "UPDATE nq_idempotency_keys SET request_hash = %s, request_digest = NULL"
            " WHERE notification_id = %s",
            (request_hash, id),
        )
        if row_copy:
            conn.execute("UPDATE nq_jobs SET request_hash = %s WHERE id = %s", (request_hash, id))


def _door_hash(url: str, key: str) -> str:
    """The request hash the SQL door stores for its test request under `key`."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT nq_stored_hash(request_digest, request_hash) FROM nq_idempotency_keys"
            " WHERE key = %s",
            (key,),
        ).fetchone()
    assert row is not None
    return str(row[0])


async def test_keys_in_every_form_a_release_wrote_answer_a_key_seen_before(
    database_url: str,
) -> None:
    url = database_url
    async with Database(url, pool_size=2) as db:
        service = notification_service(db, announce=False)
        # Written today: the 16-byte form only, no copy in the row.
        short = new()
        (made_short,) = await service.enqueue_many([short])
        assert _rows_hash(url, made_short.notification.id) == (None, None)
        assert _key_digest(url, made_short.notification.id) == bytes.fromhex(
            short.request_hash[:32]
        )
        door_short = _door(url, "door-short", "hello")
        assert _rows_hash(url, door_short) == (None, None)
        # Written before 0033 (a copy in the row) and before 0036 (the hex form only).
        before, hex_only = new(), new()
        made = await service.enqueue_many([before, hex_only])
        _as_before_the_contracts(url, made[0].notification.id, before.request_hash, row_copy=True)
        _as_before_the_contracts(
            url, made[1].notification.id, hex_only.request_hash, row_copy=False
        )
        door_before = _door(url, "door-before", "hello")
        # The door's own hash of its request, stored in the hex form (padded to 64 characters).
        _as_before_the_contracts(
            url, door_before, _door_hash(url, "door-before") * 2, row_copy=True
        )

        for made_one in (before, hex_only, short):
            assert await _answers(service, made_one) == (True, True)
        # Finished: the row in the log, the key's hash still the one compared.
        await finish(db, await claim_due(db, 5))
        for made_one in (before, hex_only, short):
            assert await _answers(service, made_one) == (True, True)

        for key, id in (("door-before", door_before), ("door-short", door_short)):
            assert _door(url, key, "hello") == id
            with pytest.raises(psycopg.errors.UniqueViolation, match="different request"):
                _door(url, key, "another")
