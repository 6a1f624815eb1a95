"""The seam between the engines: what plain PostgreSQL and Citus do differently, behind one
interface (as River's `riverdriver`), and the parameters of the statements that cross it.

A repository asks `EngineRepository.driver()` for the engine's driver and calls it; it never
asks which engine it is. `PostgresDriver` (engine_postgresql.py) runs one statement over the
whole queue; `CitusDriver` (engine_citus.py) finds the buckets first and runs a router statement
per bucket (docs/scaling.md, "Citus: every role"). What both engines run alike is no method
here: the repositories run it themselves. The rules both shapes share are written once, as
named fragments of the SQL files (`{{_name}}`, queries.py). The worker's claim still chooses its
shape in delivery.py.

The parameters that cross the seam are the TypedDicts below (a repository's other statements of
more than a few parameters have theirs beside it): a plain dict for psycopg, no copy per call,
its keys and types checked by mypy at every call site.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Protocol, TypedDict

from notify_queue.models import Completion, Engine
from notify_queue.repositories.db import Connection, Database, Row


class ClaimsRelease(TypedDict):
    """Claimed, untried notifications handed back: each id with the token of its claim."""

    ids: list[uuid.UUID]
    claim_tokens: list[uuid.UUID]


class HousekeepingBatch(TypedDict):
    """A housekeeping step's batch: at most `limit` rows; the events of rows without a URL of
    their own or a policy's go to `default_webhook_url` (--webhook-url)."""

    limit: int
    default_webhook_url: str | None


class RateWindowsPrune(TypedDict):
    """The windows older than the longest in use (the default's, or a policy's) count nothing;
    `limit` bounds a chunk where the engine deletes in chunks."""

    default_window_seconds: float
    limit: int


class WebhookClaim(TypedDict):
    """A relay's claim: up to `limit` due events, each leased `lease_seconds` under
    `claim_token`; one whose `max_attempts` are used ends failed instead."""

    limit: int
    lease_seconds: float
    max_attempts: int
    claim_token: uuid.UUID


class NotificationCancel(TypedDict):
    id: uuid.UUID
    default_webhook_url: str | None


class EscalationAcknowledge(TypedDict):
    id: uuid.UUID
    by: str | None
    default_webhook_url: str | None


class KubeLinkSave(TypedDict):
    """A Notification object and the row it became."""

    uid: str
    namespace: str
    name: str
    notification_id: uuid.UUID
    generation: int


class StatusOutboxTake(TypedDict):
    namespace: str | None
    limit: int


class LogKeysChunk(TypedDict):
    """Up to `limit` idempotency keys of a log partition's rows, after the id `after`."""

    partition: str
    after: uuid.UUID
    limit: int


class DeliveriesComplete(TypedDict):
    """A worker's results, one entry per notification in each list (delivery.py builds them from
    the completions); a list that would hold only NULLs (or only false) is sent as NULL."""

    ids: list[uuid.UUID]
    claim_tokens: list[uuid.UUID]
    statuses: list[str]
    retry_in_seconds: list[float | None] | None
    last_errors: list[str | None] | None
    provider_message_ids: list[str | None]
    providers: list[str | None]
    # Each result's attempt log is a JSON array already: joined into one, not dumped again.
    attempts: str
    give_back: list[bool] | None
    next_attempt_ats: list[datetime | None] | None
    addresses_gone: list[bool] | None
    bound_providers: list[str | None] | None
    waiting_reasons: list[str | None] | None
    waiting_details: list[str | None] | None
    default_webhook_url: str | None


# What delivery.py hands a driver to build a batch's parameters from its completions (a Citus
# driver splits the batch by bucket first), and what recording a batch answers: the ids
# accepted, and whether webhook events may have been written.
ParamsOf = Callable[[Sequence[Completion]], DeliveriesComplete]
Recorded = tuple[set[uuid.UUID], bool]


class Driver(Protocol):
    """What differs between the engines; every method serves a whole batch."""

    engine: Engine

    async def rate_windows_prune(self, db: Database, params: RateWindowsPrune) -> int: ...

    async def claims_release(self, db: Database, params: ClaimsRelease) -> int: ...

    async def deliveries_complete(
        self, db: Database, results: Sequence[Completion], params_of: ParamsOf
    ) -> Recorded:
        """Record a batch of results, each independent of the others (a stale claim token's is
        not accepted)."""
        ...

    async def deliveries_record(
        self, conn: Connection, params: DeliveriesComplete, bucket: int | None
    ) -> Recorded:
        """The same in the caller's transaction (a claim's screened rows; on Citus, rows of the
        claim's `bucket`)."""
        ...

    async def leases_recover_expired(
        self, db: Database, params: HousekeepingBatch
    ) -> tuple[int, int]:
        """(recovered, dead-lettered)."""
        ...

    async def notifications_expire_overdue(
        self, db: Database, params: HousekeepingBatch
    ) -> int: ...

    async def webhook_events_claim(self, db: Database, params: WebhookClaim) -> list[Row]:
        """The claimed events' rows (none of NULLs)."""
        ...

    async def notification_cancel(self, conn: Connection, params: NotificationCancel) -> bool:
        """Cancel a PENDING row (or a digest's open item) in `conn`'s transaction; whether it
        was."""
        ...

    async def notification_retry(self, conn: Connection, id: uuid.UUID) -> bool:
        """Move a FAILED or DEAD_LETTERED row back to the queue in `conn`'s transaction."""
        ...

    async def notifications_retry_batch(
        self, db: Database, *, status: str, limit: int
    ) -> tuple[int, int]:
        """(retried, remaining) of the oldest rows in `status`."""
        ...

    async def escalation_acknowledge(self, db: Database, params: EscalationAcknowledge) -> bool:
        """Mark the escalation acknowledged (once) and cancel its PENDING steps; False: no such
        escalation."""
        ...

    async def kube_link_save(self, db: Database, params: KubeLinkSave) -> None:
        """Link the object to its row and queue its first status write (idempotent)."""
        ...

    async def status_outbox_take(self, conn: Connection, params: StatusOutboxTake) -> list[Row]:
        """The outbox's oldest changes, coalesced per object, in `status_outbox_take`'s rows."""
        ...

    async def kube_finished_take_due(self, db: Database, params: StatusOutboxTake) -> list[Row]:
        """The links whose TTL after finishing ran out, marked as being deleted."""
        ...

    async def delivery_log_forget_keys(self, conn: Connection, params: LogKeysChunk) -> Row | None:
        """One chunk of a retired partition's keys forgotten; `last_id` the last one."""
        ...

    async def delivery_log_detach(self, conn: Connection, *, partition: str) -> None:
        """Detach a partition of the log (on a session connection: docs/operations.md)."""
        ...
