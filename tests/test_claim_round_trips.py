"""The drain's round trips (docs/performance.md, "The claim in one round trip").

A claim whose candidates are all address-targeted is one call in autocommit
(functions/nq_claim.sql), the completion another (nq_complete_deliveries). A claim that meets a
user-targeted candidate claims in a transaction (BEGIN, the lock step, the admission, COMMIT),
where the worker decides quiet hours and the send-time check commits with the claim; the worker
stays with that shape while its claims meet such candidates, and goes back to one call after a
claim that met none.
Counted at the driver (statements and psycopg's own BEGIN and COMMIT), never timed.

The one call must never hand out what the send-time check would hold: a user-targeted row whose
recipient opted out is SUPPRESSED in the claim's transaction, whichever shape the worker tried
first. The negative control is nq_claim without its check of the candidates (replaced in the
test's database): the opted-out row is then handed out.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg._connection_base import BaseConnection

from notify_queue.models import (
    Channel,
    Completion,
    NewNotification,
    Preferences,
    Priority,
    Recipient,
    Status,
)
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery import DeliveryRepository
from notify_queue.repositories.recipients import RecipientRepository
from notify_queue.services.delivery import DeliveryService
from tests.support import defaults, new, notification_service, replace_in_function


@contextmanager
def round_trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """What the block sends: each statement (a call by its function's name), and each command
    psycopg sends by itself."""
    sent: list[str] = []
    # The cursor's execute: a connection's execute runs one too, and the claim reads its rows
    # through a cursor of its own (Connection.fetch_named).
    execute = psycopg.AsyncCursor.execute
    command = BaseConnection._exec_command

    async def counting(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if str(query):  # not the pool's check of a connection idle for a while (an empty query)
            called = re.search(r"FROM (nq_\w+)\(", str(query))
            sent.append(called.group(1) if called else str(query)[:40])
        return await execute(self, query, *args, **kwargs)

    def counting_command(self: Any, text: bytes, *args: Any, **kwargs: Any) -> Any:
        sent.append(bytes(text).decode())
        return (yield from command(self, text, *args, **kwargs))

    with monkeypatch.context() as patch:
        patch.setattr(psycopg.AsyncCursor, "execute", counting)
        patch.setattr(BaseConnection, "_exec_command", counting_command)
        yield sent


def targeted(recipient_id: str) -> NewNotification:
    return dataclasses.replace(new(), recipient_id=recipient_id)


async def _claim(repository: DeliveryRepository) -> list[Any]:
    batch = await repository.notifications_claim(
        priorities=list(Priority), channels=list(Channel), limit=10
    )
    return batch.claimed


async def test_a_claim_of_address_targeted_rows_is_one_round_trip_and_a_completion_one(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Database(database_url, pool_size=1) as db:
        repository = DeliveryRepository(db, defaults())
        await _claim(repository)  # reads the engine (cached afterwards): not counted
        await notification_service(db, announce=False).enqueue_many([new() for _ in range(5)])
        with round_trips(monkeypatch) as claim:
            claimed = await _claim(repository)
        with round_trips(monkeypatch) as completion:
            recorded = await repository.deliveries_complete(
                completions=[
                    Completion(c.id, c.claim_token, Status.SENT, None, None, f"m-{c.id}", "log")
                    for c in claimed
                ]
            )
    assert len(claimed) == 5 and len(recorded.accepted) == 5
    assert claim == ["nq_claim_v2"], claim
    assert completion == ["nq_complete_deliveries"], completion


async def test_a_claim_that_meets_a_user_targeted_row_claims_in_a_transaction(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    transaction = [
        "BEGIN",
        "nq_claim_lock_v2",
        "nq_claim_v2",
        "COMMIT",
    ]
    async with Database(database_url, pool_size=1) as db:
        repository = DeliveryRepository(db, defaults(rate_limit=100))
        creates = notification_service(db, announce=False)
        await _claim(repository)
        await creates.enqueue_many([new(), targeted("u-1"), new()])
        with round_trips(monkeypatch) as first:
            assert len(await _claim(repository)) == 3
        # The one call admitted nothing and said so; the transaction claimed all three.
        assert first == ["nq_claim_v2", *transaction], first
        await creates.enqueue_many([targeted("u-1"), new()])
        with round_trips(monkeypatch) as second:
            assert len(await _claim(repository)) == 2
        assert second == transaction, second  # the last claim met one: no call wasted first
        await creates.enqueue_many([new(), new()])
        with round_trips(monkeypatch) as third:
            assert len(await _claim(repository)) == 2
        assert third == transaction, third  # the last claim met one: this one finds none...
        await creates.enqueue_many([new()])
        with round_trips(monkeypatch) as fourth:
            assert len(await _claim(repository)) == 1
        assert fourth == ["nq_claim_v2"], fourth  # ...so one call


@pytest.mark.parametrize("check", ["with_check", "without_check"])
async def test_an_opted_out_recipient_gets_nothing_whichever_shape_claims_first(
    database_url: str, check: str
) -> None:
    if check == "without_check":
        # nq_claim as if no candidate were ever user-targeted.
        await replace_in_function(
            database_url, "nq_claim_v2", "IF locked.targeted THEN", "IF false THEN"
        )
    async with Database(database_url, pool_size=2) as db:
        now = datetime.now(UTC)
        await RecipientRepository(db).recipient_put(
            recipient=Recipient(
                id="u-1",
                email="u-1@example.com",
                phone=None,
                push_tokens=[],
                preferences=Preferences(exists=True, opt_out_all=True),
                created_at=now,
                updated_at=now,
            )
        )
        opted_out = targeted("u-1")
        await notification_service(db, announce=False).enqueue_many([new(), opted_out])
        service = DeliveryService(
            DeliveryRepository(db, defaults()), priorities=list(Priority), channels=list(Channel)
        )
        batch = await service.claim(10)
    handed_out = {c.id for c in batch.claimed}
    if check == "with_check":
        assert opted_out.id not in handed_out and len(handed_out) == 1
        assert [(c.id, c.status) for c in batch.screened or []] == [
            (opted_out.id, Status.SUPPRESSED)
        ]
    else:
        assert opted_out.id in handed_out  # the race the check closes: sent to an opt-out


async def _suppress(database_url: str, address: str | None, *, remove: str | None = None) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        if remove is not None:
            await conn.execute("DELETE FROM nq_suppressions WHERE address = %s", [remove])
        if address is not None:
            await conn.execute(
                "INSERT INTO nq_suppressions (channel, address, reason, at)"
                " VALUES ('email', %s, 'bounced', now())",
                [address],
            )


async def test_the_send_time_suppression_check_is_read_by_the_claim_itself(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An address on the suppression list (docs/receipts.md) is screened by what the claim
    read: no read of the list of its own. A batch with no such address is the one call; one with
    an address on the list adds only the completion that ends it SUPPRESSED, whichever shape
    claims it."""
    bounced = "gone@example.com"
    async with Database(database_url, pool_size=1) as db:
        now = datetime.now(UTC)
        await RecipientRepository(db).recipient_put(
            recipient=Recipient(
                id="u-1",
                email=bounced,
                phone=None,
                push_tokens=[],
                preferences=Preferences(exists=True),
                created_at=now,
                updated_at=now,
            )
        )
        service = DeliveryService(
            DeliveryRepository(db, defaults(rate_limit=100)),
            priorities=list(Priority),
            channels=list(Channel),
        )
        creates = notification_service(db, announce=False)
        await service.claim(10)  # reads the engine (cached afterwards): not counted
        await creates.enqueue_many([new(), new()])
        with round_trips(monkeypatch) as clean:
            assert len((await service.claim(10)).claimed) == 2
        assert clean == ["nq_claim_v2"], clean
        # Queued before the bounce is known: stopped at send time, whatever the address's case.
        stopped = new(recipient=bounced.upper())
        await creates.enqueue_many([stopped, new()])
        await _suppress(database_url, bounced)
        with round_trips(monkeypatch) as alone:
            batch = await service.claim(10)
        assert len(batch.claimed) == 1
        assert [(c.id, c.status, c.last_error) for c in batch.screened or []] == [
            (stopped.id, Status.SUPPRESSED, "suppressed: bounced")
        ]
        assert alone == ["nq_claim_v2", "BEGIN", "nq_complete_deliveries", "COMMIT"], alone
        # A user-targeted one: screened in the claim's transaction.
        await _suppress(database_url, None, remove=bounced)
        again = dataclasses.replace(targeted("u-1"), recipient=bounced)
        await creates.enqueue_many([again])
        await _suppress(database_url, bounced)
        with round_trips(monkeypatch) as transaction:
            batch = await service.claim(10)
        assert not batch.claimed
        assert [(c.id, c.status) for c in batch.screened or []] == [(again.id, Status.SUPPRESSED)]
        # The one call met a user-targeted candidate first (test above), then the transaction.
        assert transaction == [
            "nq_claim_v2",
            "BEGIN",
            "nq_claim_lock_v2",
            "nq_claim_v2",
            "nq_complete_deliveries",
            "COMMIT",
        ], transaction


async def test_the_creation_suppression_check_is_inside_the_common_batchs_statement(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API's common batch probes the suppression list inside its one statement
    (nq_enqueue_pending_v2): no read of its own. A batch with a suppressed address inserts
    nothing there and is created the general way, that address born SUPPRESSED."""
    bounced = "gone@example.com"
    await _suppress(database_url, bounced)
    async with Database(database_url, pool_size=1) as db:
        creates = notification_service(db, announce=False)
        with round_trips(monkeypatch) as clean:
            results = await creates.enqueue_many([new(), new()])
        assert [r.notification.status for r in results] == [Status.PENDING] * 2
        assert clean == ["nq_enqueue_pending_v2"], clean
        with round_trips(monkeypatch) as listed:
            results = await creates.enqueue_many([new(), new(recipient=bounced.upper())])
        assert [(r.notification.status, r.notification.last_error) for r in results] == [
            (Status.PENDING, None),
            (Status.SUPPRESSED, "suppressed: bounced"),
        ]
        assert listed[0] == "nq_enqueue_pending_v2" and "nq_insert_notifications" in listed
