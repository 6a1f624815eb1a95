"""The worker's side of the queue: claim, complete, hand back, recover, expire, wake-ups.

Each method is one statement (a claim is two, in one transaction) serving a whole batch.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, time
from typing import Any, TypedDict

from notify_queue.models import (
    CHANNEL_BY_VALUE,
    Channel,
    ClaimedNotification,
    Completion,
    Engine,
    Failover,
    Preferences,
    Priority,
    Wakeup,
)
from notify_queue.repositories.db import Connection, Database
from notify_queue.repositories.driver import (
    ClaimsRelease,
    DeliveriesComplete,
    HousekeepingBatch,
    RateWindowsPrune,
)
from notify_queue.repositories.engine import EngineRepository
from notify_queue.repositories.engine_citus import citus_queue_returned_changes
from notify_queue.repositories.webhooks import WEBHOOK_EVENTS_CHANNEL

WAKEUP_CHANNEL = "nq_wakeup"
_WAKEUPS = {WAKEUP_CHANNEL: Wakeup.WORK, WEBHOOK_EVENTS_CHANNEL: Wakeup.WEBHOOK_EVENTS}


@dataclass(frozen=True, slots=True)
class ClaimedBatch:
    claimed: list[ClaimedNotification]
    # Channels of the candidates that were over their recipient's rate limit and now wait.
    rate_limited: list[Channel]
    # Claimed, then not sent by the send-time check (suppressed, deferred, expired): recorded.
    screened: list[Completion] | None = None


# Sees each claimed notification, and whether the claim admitted it without a rate-limit slot
# because quiet hours hold it (`QuietHours`): the completion to record, or None to send it.
Screen = Callable[[ClaimedNotification, bool], Completion | None]


@dataclass(frozen=True, slots=True)
class Recorded:
    """What a completion recorded: the ids whose result was accepted (a stale claim token's
    is not), and whether it may have written webhook events (a finished row with a URL of its
    own or a policy, or the worker's default URL). The worker wakes its relay only then: a
    deployment without webhooks never runs the relay's claim after a completion."""

    accepted: set[uuid.UUID]
    events_possible: bool


@dataclass(frozen=True, slots=True)
class DigestContents:
    """A closed digest as its carrier sends it: key, template and items in the order they
    joined (each `subject`, `body`, `metadata`, `createdAt`)."""

    id: uuid.UUID
    key: str
    template: str | None
    template_channels: dict[str, dict[str, str]] | None
    items: list[dict[str, Any]]
    # The items' stored trace contexts, in the same order (those that have one).
    traceparents: list[str]


@dataclass(frozen=True, slots=True)
class QuietHoursCandidate:
    """A candidate of a claim whose stored recipient has quiet hours, before admission."""

    id: uuid.UUID
    priority: Priority
    category: str
    timezone: str
    quiet_start: time
    quiet_end: time


# True when quiet hours hold the candidate now: it is kept out of the recipient's window.
QuietHours = Callable[[QuietHoursCandidate], bool]


@dataclass(frozen=True, slots=True)
class ChainHeads:
    """Where a claim binds a row that is not bound yet (its `provider` column): the first provider
    of each channel's chain, and the providers this worker knows (a policy's chain is read through
    them, as the worker's routing reads it)."""

    channels: dict[Channel, str]
    known: tuple[str, ...]


NO_CHAIN_HEADS = ChainHeads({}, ())


@dataclass(frozen=True, slots=True)
class DeliveryDefaults:
    """The worker's policy defaults, for notifications whose policy does not set a value."""

    rate_limit: int
    rate_window_seconds: float
    backoff_base_seconds: float
    backoff_max_seconds: float
    lease_seconds: float
    webhook_url: str | None
    # Seconds of waiting (since due) that raise a NORMAL or LOW row one priority in the claim's
    # order (docs/design.md, "Aging"); 0 keeps strict priority.
    aging_seconds: float = 600.0


class DueLanes(TypedDict):
    """`next_due_at`: a worker's lanes, priority ranks (HIGH 0 first) and channel values."""

    priorities: list[int]
    channels: list[str]


class DeliveryRepository:
    def __init__(
        self, db: Database, defaults: DeliveryDefaults, engine: EngineRepository | None = None
    ) -> None:
        self._db = db
        self._defaults = defaults
        # The claim's shape follows the engine (docs/scaling.md): one statement pair over the
        # whole queue on plain PostgreSQL, bucket by bucket on Citus.
        self._engine = engine or EngineRepository(db)
        # Plain PostgreSQL: whether the next claim tries one call (`claim` alone), as long as the
        # last claim found no user-targeted candidate: a queue of such rows claims in its
        # transaction without a wasted call.
        self._claim_alone = True

    async def notifications_claim(
        self,
        *,
        priorities: Sequence[Priority],
        channels: Sequence[Channel],
        limit: int,
        screen: Screen | None = None,
        quiet_hours: QuietHours | None = None,
        chain_heads: ChainHeads = NO_CHAIN_HEADS,
    ) -> ClaimedBatch:
        """Claim a batch. `screen` sees each claimed notification inside the claim transaction;
        what it returns a completion for is recorded there (not handed out), so a claim that
        suppresses or defers commits, or fails, as one. `quiet_hours` says, between the two
        statements, which candidates quiet hours hold: they are admitted without a slot, for
        `screen` to defer, and never push a sendable row of their recipient out of its window."""
        lock_params: dict[str, Any] = {
            "priorities": sorted(p.rank for p in priorities),
            "channels": [c.value for c in channels],
            "limit": limit,
            "aging_seconds": self._defaults.aging_seconds,
        }
        engine = await self._engine.engine_get()
        if engine.engine is not Engine.CITUS:
            if self._claim_alone:
                alone = await self._claim_in_one_call(lock_params, chain_heads)
                if alone is not None:
                    return await self._screened_after(alone, screen)
            # The steps' functions carry the drain's plan settings (functions/nq_claim_v2.sql), as
            # the completion's does: one plan per connection, reading by index whatever the
            # statistics.
            async with self._db.transaction() as conn:
                return await self._claim_in(conn, lock_params, screen, quiet_hours, chain_heads)
        # Citus: a lock-free look at the most urgent due rows, then one router claim per bucket
        # in the order and with the sizes of _bucket_visits, each in its own transaction.
        async with self._db.connection() as conn:
            due = await conn.fetch_all("claim_due_buckets", lock_params)
            if due:
                # Today's log partition, which nq_finish_held makes on plain PostgreSQL: a delegated
                # move runs on a worker node, where no partition can be created (DDL).
                await conn.fetch_one("notification_log_ready")
        batch = ClaimedBatch([], [], [])
        visits = _bucket_visits(due)
        for i, visit in enumerate(visits):
            left = limit - len(batch.claimed) - len(batch.screened or [])
            if visit.last:
                # Room for the more urgent rows of the buckets still to visit is kept back; the
                # rest of the batch is this bucket's: its urgent rows, then its oldest P* rows.
                take = left - sum(v.urgent for v in visits[i + 1 :])
            else:
                take = min(left, visit.urgent)
            if take <= 0 or visit.max_rank < 0:
                continue
            params = {
                **lock_params,
                "max_rank": visit.max_rank,
                "limit": take,
                "bucket": visit.bucket,
            }
            try:
                async with self._db.transaction() as conn:
                    part = await self._claim_in(
                        conn,
                        params,
                        screen,
                        quiet_hours,
                        chain_heads,
                    )
            except Exception:
                # Each bucket's claim commits on its own: rows already claimed must reach the
                # worker, or they would wait PROCESSING for their lease to run out. The error
                # comes back at the next claim.
                if batch.claimed or batch.screened:
                    return batch
                raise
            batch = ClaimedBatch(
                batch.claimed + part.claimed,
                batch.rate_limited + part.rate_limited,
                (batch.screened or []) + (part.screened or []),
            )
        return batch

    async def _claim_in(
        self,
        conn: Connection,
        lock_params: dict[str, Any],
        screen: Screen | None,
        quiet_hours: QuietHours | None,
        chain_heads: ChainHeads,
    ) -> ClaimedBatch:
        """One claim in `conn`'s transaction: lock the candidates, admit them, screen them. With a
        `bucket` among the parameters, the claim of that bucket alone (Citus: one shard)."""
        routed = "bucket" in lock_params
        # Each statement named at its call (the security test reads the names from the code).
        if routed:
            locked = await conn.fetch_one("claim_lock_candidates_bucket", lock_params)
        else:
            locked = await conn.fetch_one("claim_lock_candidates", lock_params, prepare=True)
        if not routed and locked is not None:
            self._claim_alone = not locked["targeted"]
        if locked is None or not locked["ids"]:
            return ClaimedBatch([], [])
        quiet = _quiet_held(locked, quiet_hours)
        claim_token = uuid.uuid4()
        admit_params = {
            **lock_params,
            "ids": locked["ids"],
            **self._admission(claim_token, chain_heads),
            "quiet_ids": list(quiet),
        }
        if routed:
            # Both steps are functions delegated to the bucket's node (citus/functions.sql); the
            # first locked the candidates' digests too (SKIP LOCKED), which the second reads.
            admit_params["digest_ids"] = locked["digest_ids"]
            rows = await conn.fetch_named("claim_admit_candidates_bucket", admit_params)
            await citus_queue_returned_changes(conn, rows[0]._asdict() if rows else None)
        else:
            rows = await conn.fetch_named("claim", admit_params, prepare=True)
        admitted = _admitted(rows, claim_token)
        if screen is None:
            return admitted
        kept: list[ClaimedNotification] = []
        screened: list[Completion] = []
        for c in admitted.claimed:
            decision = screen(c, c.id in quiet)
            if decision is None:
                kept.append(c)
            else:
                screened.append(decision)
        if screened:
            await self._complete(conn, screened, bucket=lock_params.get("bucket"))
        return ClaimedBatch(kept, admitted.rate_limited, screened)

    async def _claim_in_one_call(
        self, lock_params: dict[str, Any], chain_heads: ChainHeads
    ) -> ClaimedBatch | None:
        """The claim as one call in autocommit (`claim` without candidates: nq_claim_v2): one round
        trip where the transaction's claim makes four. None, with nothing claimed, when a
        candidate is user-targeted: quiet hours and the send-time check decide those in the claim's
        transaction. Of an address-targeted row neither has anything to decide (screen_claimed
        returns None for a row without a recipientId, and without quiet hours nothing is admitted
        without its place), so what this hands out is what the transaction's claim would."""
        claim_token = uuid.uuid4()
        params = {
            **lock_params,
            **self._admission(claim_token, chain_heads),
            "ids": None,
            "quiet_ids": [],
        }
        async with self._db.connection() as conn:
            rows = await conn.fetch_named("claim", params, prepare=True)
        if rows and rows[0].screen:
            self._claim_alone = False
            return None
        return _admitted(rows, claim_token)

    async def _screened_after(self, batch: ClaimedBatch, screen: Screen | None) -> ClaimedBatch:
        """The one call's batch after `screen`: of its rows (address-targeted, none held by
        quiet hours) only those the claim read as suppressed have something to decide, recorded
        in a statement of their own (claimed with this claim's token, so still theirs). Nothing
        to record, no statement."""
        if screen is None or all(c.suppressed is None for c in batch.claimed):
            return batch
        kept: list[ClaimedNotification] = []
        screened: list[Completion] = []
        for c in batch.claimed:
            decision = screen(c, False)
            if decision is None:
                kept.append(c)
            else:
                screened.append(decision)
        if screened:
            async with self._db.transaction() as conn:
                await self._complete(conn, screened)
        return ClaimedBatch(kept, batch.rate_limited, screened)

    def _admission(self, claim_token: uuid.UUID, chain_heads: ChainHeads) -> dict[str, Any]:
        """The admission's parameters but the candidates (and the quiet ones among them)."""
        d = self._defaults
        return {
            # One token per claim: Citus refuses gen_random_uuid() in a distributed UPDATE, and
            # completion matches (id, token), which a batch's token keeps unique per attempt.
            "claim_token": claim_token,
            "rate_limit": d.rate_limit,
            "rate_window_seconds": d.rate_window_seconds,
            "lease_seconds": d.lease_seconds,
            "backoff_base_seconds": d.backoff_base_seconds,
            "backoff_max_seconds": d.backoff_max_seconds,
            "chain_channels": [c.value for c in chain_heads.channels],
            "chain_heads": list(chain_heads.channels.values()),
            "known_providers": list(chain_heads.known),
            # For nq_finish_held when the claim cancels acknowledged escalation steps (no event:
            # CANCELLED has none; passed so the call is nq_finish_held's usual one).
            "webhook_url": d.webhook_url,
        }

    async def digests_contents(
        self, *, digests: Sequence[tuple[int, uuid.UUID]]
    ) -> dict[uuid.UUID, DigestContents]:
        """What the carriers of these (bucket, digest id) send (docs/digests.md)."""
        rows = await self._db.fetch_all(
            "digest_contents",
            {"buckets": sorted({b for b, _ in digests}), "ids": sorted({i for _, i in digests})},
        )
        return {
            r["id"]: DigestContents(
                id=r["id"],
                key=r["key"],
                template=r["template"],
                template_channels=r["template_channels"],
                items=list(r["items"]),
                traceparents=list(r["traceparents"]),
            )
            for r in rows
        }

    async def deliveries_complete(self, *, completions: Sequence[Completion]) -> Recorded:
        """Record results: the ids accepted, and whether webhook events may have been written."""
        if not completions:
            return Recorded(set(), False)
        driver = await self._engine.driver()
        accepted, events = await driver.deliveries_complete(
            self._db, completions, self._completion_params
        )
        return Recorded(accepted, events)

    async def _complete(
        self, conn: Connection, completions: Sequence[Completion], *, bucket: int | None = None
    ) -> Recorded:
        """Record results in the caller's transaction (a claim's screened rows; on Citus, rows of
        the claim's `bucket`)."""
        driver = await self._engine.driver(conn=conn)
        accepted, events = await driver.deliveries_record(
            conn, self._completion_params(completions), bucket
        )
        return Recorded(accepted, events)

    def _completion_params(self, completions: Sequence[Completion]) -> DeliveriesComplete:
        """The completion statement's parameters, one entry per result in each list."""
        return {
            "ids": [c.id for c in completions],
            "claim_tokens": [c.claim_token for c in completions],
            "statuses": [c.status.value for c in completions],
            # float(): one int among floats (a delay of 0) makes psycopg refuse the whole
            # array, and the completer would retry that batch forever.
            "retry_in_seconds": _nulls_as_null(
                [
                    None if c.retry_in_seconds is None else float(c.retry_in_seconds)
                    for c in completions
                ]
            ),
            "last_errors": _nulls_as_null([c.last_error for c in completions]),
            "provider_message_ids": [c.provider_message_id for c in completions],
            "providers": [c.provider for c in completions],
            # Each is a JSON array already: joined, not dumped again (see the query).
            "attempts": "[" + ",".join(c.attempts_json for c in completions) + "]",
            "give_back": _flags([c.give_back_attempt for c in completions]),
            "next_attempt_ats": _nulls_as_null([c.next_attempt_at for c in completions]),
            "addresses_gone": _flags([c.address_gone for c in completions]),
            "bound_providers": _nulls_as_null([c.bound_provider for c in completions]),
            "waiting_reasons": _nulls_as_null([c.waits_for for c in completions]),
            "waiting_details": _nulls_as_null([c.waiting_detail for c in completions]),
            "default_webhook_url": self._defaults.webhook_url,
        }

    async def claims_release(self, *, claims: Sequence[tuple[uuid.UUID, uuid.UUID]]) -> int:
        """Hand claimed, untried notifications back without using an attempt."""
        if not claims:
            return 0
        params: ClaimsRelease = {
            "ids": [c[0] for c in claims],
            "claim_tokens": [c[1] for c in claims],
        }
        return await (await self._engine.driver()).claims_release(self._db, params)

    async def leases_recover_expired(self, *, limit: int = 1000) -> tuple[int, int]:
        """Return (recovered, dead-lettered) for leases that ran out."""
        params: HousekeepingBatch = {
            "limit": limit,
            "default_webhook_url": self._defaults.webhook_url,
        }
        return await (await self._engine.driver()).leases_recover_expired(self._db, params)

    async def notifications_expire_overdue(self, *, limit: int = 1000) -> int:
        params: HousekeepingBatch = {
            "limit": limit,
            "default_webhook_url": self._defaults.webhook_url,
        }
        return await (await self._engine.driver()).notifications_expire_overdue(self._db, params)

    async def next_due_at(
        self, *, priorities: Sequence[Priority], channels: Sequence[Channel]
    ) -> tuple[datetime | None, datetime]:
        """The earliest next_attempt_at of claimable rows in these lanes (the claim's filter:
        priorities, channels, not expired), and the database's now."""
        params: DueLanes = {
            "priorities": sorted(p.rank for p in priorities),
            "channels": [c.value for c in channels],
        }
        row = await self._db.fetch_one("next_due_at", params)
        assert row is not None
        return row["next_due_at"], row["now"]

    async def rate_windows_prune(self, *, limit: int = 10_000) -> int:
        """Delete windows nothing counts any more (in chunks of `limit` where the engine can)."""
        params: RateWindowsPrune = {
            "default_window_seconds": self._defaults.rate_window_seconds,
            "limit": limit,
        }
        return await (await self._engine.driver()).rate_windows_prune(self._db, params)

    async def housekeeping_next_due_at(self) -> tuple[datetime | None, datetime]:
        """When housekeeping next has work (the first lease to run out, the first PENDING row
        to expire, whichever is earlier), and the database's now."""
        row = await self._db.fetch_one("housekeeping_next_due_at")
        assert row is not None
        due = [t for t in (row["lease_ends_at"], row["expires_at"]) if t is not None]
        return (min(due) if due else None), row["now"]

    async def wakeups(
        self,
        stop: asyncio.Event,
        *,
        webhook_events: bool,
        on_state: Callable[[bool], None] | None = None,
    ) -> AsyncIterator[Wakeup]:
        """New work, and with `webhook_events` new webhook events, on one LISTEN connection."""
        channels = (WAKEUP_CHANNEL, WEBHOOK_EVENTS_CHANNEL) if webhook_events else (WAKEUP_CHANNEL,)
        async for channel in self._db.listen(channels, stop, on_state=on_state):
            yield _WAKEUPS.get(channel, Wakeup.RECONNECTED)


@dataclass(frozen=True, slots=True)
class _BucketVisit:
    """One bucket's router claim within a Citus claim (docs/scaling.md "Citus: the claim")."""

    bucket: int
    # Rows of the look more urgent than its least urgent priority P*: all claimed in this batch.
    urgent: int
    # P* itself (an aged priority's rank: higher is less urgent).
    last_priority: int
    # Whether the bucket had P* rows in the look: then it may fill the batch's room with them.
    last: bool

    @property
    def max_rank(self) -> int:
        """The least urgent rank its lock statement may take: P* when it fills room with P*
        rows, only the more urgent ones otherwise (so no P* row jumps the fairness order)."""
        return self.last_priority if self.last else self.last_priority - 1


# A completion's column that is NULL (or false) for every result of its batch (eight of fourteen
# for a batch of SENT results) is sent as one NULL instead of an array of them: psycopg dumps an
# array element by element in Python, and the functions read
# their arrays through one multi-argument `unnest`, which pads a NULL array with NULLs
# (tests/test_completion_arrays.py).
# A NULL flag reads as false: they are used only as `CASE WHEN flag` and `WHERE flag`.


def _nulls_as_null(values: list[Any]) -> list[Any] | None:
    return None if values.count(None) == len(values) else values


def _flags(values: list[bool]) -> list[bool] | None:
    return values if any(values) else None


def _bucket_visits(due: Sequence[dict[str, Any]]) -> list[_BucketVisit]:
    """The order of a Citus claim's buckets from the look (`claim_due_buckets`): first the
    buckets that have only rows more urgent than P*, most urgent first; then those with P*
    rows, the one whose oldest P* row is oldest first, each filling what the batch has left
    after the urgent rows of the buckets still to visit (notifications_claim)."""
    urgent_only = sorted(
        (r for r in due if r["last_due"] is None),
        key=lambda r: (r["priority"], r["due"], r["bucket"]),
    )
    with_last = sorted(
        (r for r in due if r["last_due"] is not None), key=lambda r: (r["last_due"], r["bucket"])
    )
    return [
        _BucketVisit(
            int(r["bucket"]), int(r["urgent"]), int(r["last_priority"]), r["last_due"] is not None
        )
        for r in urgent_only + with_last
    ]


def _quiet_held(locked: dict[str, Any], quiet_hours: QuietHours | None) -> set[uuid.UUID]:
    """The ids of step 1's quiet-hours candidates that `quiet_hours` says are held now."""
    if quiet_hours is None or not locked["quiet_ids"]:
        return set()
    columns = (
        locked["quiet_ids"],
        locked["quiet_priorities"],
        locked["quiet_categories"],
        locked["quiet_timezones"],
        locked["quiet_starts"],
        locked["quiet_ends"],
    )
    return {
        id_
        for id_, priority, category, timezone, start, end in zip(*columns, strict=True)
        if quiet_hours(
            QuietHoursCandidate(
                id_, Priority.from_rank(priority), category, timezone or "UTC", start, end
            )
        )
    }


def _admitted(rows: list[Any], claim_token: uuid.UUID) -> ClaimedBatch:
    """An admission's answer: its admitted rows, and the channels it deferred (on every row; one
    row of NULLs and the channels when nothing was admitted), as named tuples
    (Connection.fetch_named)."""
    claimed = [_claimed(r, claim_token) for r in rows if r.id is not None]
    return ClaimedBatch(claimed, [Channel(c) for c in rows[0].deferred_channels] if rows else [])


def _claimed(row: Any, claim_token: uuid.UUID) -> ClaimedNotification:
    """One admitted row of an admission."""
    recipient_id = row.recipient_id
    failover = row.failover
    providers = row.providers
    return ClaimedNotification(
        id=row.id,
        claim_token=claim_token,
        channel=CHANNEL_BY_VALUE[row.channel],
        recipient=row.recipient,
        subject=row.subject,
        body=row.body,
        metadata=row.metadata,
        attempt_count=row.attempt_count,
        max_attempts=row.max_attempts,
        backoff_base_seconds=row.backoff_base_seconds,
        backoff_max_seconds=row.backoff_max_seconds,
        priority=Priority.from_rank(row.priority),
        failover=Failover(failover) if failover else None,
        providers=tuple(providers) if providers else None,
        category=row.category,
        expires_at=row.expires_at,
        recipient_id=recipient_id,
        preferences=(
            None
            if recipient_id is None
            else Preferences(
                exists=row.recipient_exists,
                opt_out_all=bool(row.opt_out_all),
                opt_out_channels=frozenset(row.opt_out_channels or ()),
                opt_out_categories=frozenset(row.opt_out_categories or ()),
                timezone=row.timezone or "UTC",
                quiet_start=row.quiet_start,
                quiet_end=row.quiet_end,
            )
        ),
        bound_provider=row.bound_provider,
        sticky_provider=row.sticky_provider,
        due_at=row.send_at,
        traceparent=row.traceparent,
        digest_id=row.digest_id,
        digest_bucket=row.digest_bucket if row.digest_id is not None else None,
        suppressed=row.suppressed,
    )
