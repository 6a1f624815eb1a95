"""The drain's round trips: the claim's statements run in a transaction begun together with the
settings they are planned under, in one round trip (`Connection.drain_transaction`), which
commits at the end and rolls back when its block raises, leaving the connection ready for the next
call; the completion is one call of a function that carries the same settings. The round trips
are counted at the driver, never timed."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from notify_queue.models import Channel, Completion, Priority, Status
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery import DeliveryRepository
from tests.support import defaults, new, notification_service, status_counts


async def _settings(conn: Any) -> tuple[str, str]:
    raw: psycopg.AsyncConnection[Any] = conn._conn
    cur = await raw.execute(
        "SELECT current_setting('enable_seqscan') AS seqscan,"
        " current_setting('plan_cache_mode') AS plans"
    )
    row = await cur.fetchone()
    assert row is not None
    return row["seqscan"], row["plans"]


async def _nonzero_counts(db: Database) -> dict[str, int]:
    return {status: n for status, n in (await status_counts(db)).items() if n}


@pytest.mark.parametrize(
    ("prepared", "inside"),
    [(True, ("off", "force_generic_plan")), (False, ("off", "auto"))],
)
async def test_the_settings_hold_in_the_transaction_and_end_with_it(
    database_url: str, prepared: bool, inside: tuple[str, str]
) -> None:
    # Without prepared statements no plan is forced generic: an unprepared statement would
    # build one on every call.
    async with Database(database_url, pool_size=1, prepared_statements=prepared) as db:
        async with db.drain_transaction() as conn:
            assert await _settings(conn) == inside
        async with db.connection() as conn:
            assert await _settings(conn) == ("on", "auto")


async def test_a_claim_whose_block_raises_is_rolled_back_and_the_connection_serves_the_next(
    database_url: str,
) -> None:
    async with Database(database_url, pool_size=1) as db:
        await notification_service(db, announce=False).enqueue_many([new() for _ in range(3)])
        repository = DeliveryRepository(db, defaults())

        def screen(*_: Any) -> None:
            raise RuntimeError("a bug in the send-time check")

        with pytest.raises(RuntimeError):
            await repository.notifications_claim(
                priorities=list(Priority), channels=list(Channel), limit=10, screen=screen
            )
        assert await _nonzero_counts(db) == {"PENDING": 3}
        batch = await repository.notifications_claim(
            priorities=list(Priority), channels=list(Channel), limit=10
        )
        assert len(batch.claimed) == 3


async def test_a_failed_statement_rolls_the_transaction_back(database_url: str) -> None:
    async with Database(database_url, pool_size=1) as db:
        await notification_service(db, announce=False).enqueue_many([new()])
        repository = DeliveryRepository(db, defaults())
        with pytest.raises(psycopg.errors.DivisionByZero):
            async with db.drain_transaction() as conn:
                raw: Any = conn._conn
                await raw.execute("UPDATE nq_jobs SET status = 'PROCESSING'")
                await raw.execute("SELECT 1 / 0")
        assert await _nonzero_counts(db) == {"PENDING": 1}
        batch = await repository.notifications_claim(
            priorities=list(Priority), channels=list(Channel), limit=10
        )
        assert len(batch.claimed) == 1


async def test_a_claim_is_four_round_trips_and_a_completion_one(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BEGIN with the settings, the two claim statements, COMMIT; the completion's function,
    which carries the settings itself, in autocommit. psycopg's own transaction sent BEGIN alone,
    and the settings were a statement of their own: five and four."""
    sent: list[str] = []
    execute = psycopg.AsyncConnection.execute

    async def counting(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if str(query):  # not the pool's check of a connection idle for a while (an empty query)
            sent.append(str(query).split("\n")[-1][:40])
        return await execute(self, query, *args, **kwargs)

    async with Database(database_url, pool_size=1) as db:
        repository = DeliveryRepository(db, defaults())
        # A first claim finds nothing, and reads the engine (cached afterwards): not counted.
        await repository.notifications_claim(
            priorities=list(Priority), channels=list(Channel), limit=10
        )
        await notification_service(db, announce=False).enqueue_many([new() for _ in range(5)])
        monkeypatch.setattr(psycopg.AsyncConnection, "execute", counting)
        batch = await repository.notifications_claim(
            priorities=list(Priority), channels=list(Channel), limit=10
        )
        claim, sent[:] = list(sent), []
        recorded = await repository.deliveries_complete(
            completions=[
                Completion(c.id, c.claim_token, Status.SENT, None, None, f"m-{c.id}", "log")
                for c in batch.claimed
            ]
        )
        assert len(recorded.accepted) == 5
    assert len(claim) == 4, claim
    assert len(sent) == 1, sent
