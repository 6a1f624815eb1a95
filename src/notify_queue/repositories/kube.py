"""The operator's side of the database: object links, the status outbox, the TTL sweep, lane depths.

The status outbox is filled by the statements that change rows (nq_note_changes) for rows
that belong to Notification objects, and drained here by one writer at a time, in batches, inside
a transaction that holds an advisory lock (see `status_outbox_batch`).

On Citus the links and the outbox are plain tables on the coordinator (citus/layout.sql), and the
statements that also read the distributed notifications take another shape (engine_citus.py,
docs/scaling.md "Citus: the operator"): the link is saved before its row is locked by bucket, the
outbox's batch reads its rows by id in a second statement, the TTL sweep marks without SKIP
LOCKED. The engine's driver chooses; plain PostgreSQL runs the statements of operator.sql.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from notify_queue.models import (
    Channel,
    Delivery,
    EscalationState,
    Notification,
    Priority,
    Status,
)
from notify_queue.repositories.db import Connection, Database
from notify_queue.repositories.driver import KubeLinkSave
from notify_queue.repositories.engine import EngineRepository
from notify_queue.repositories.rows import notification_from_row
from notify_queue.repositories.workers import Lanes, lane_keys

STATUS_OUTBOX_CHANNEL = "nq_status_outbox"


@dataclass(frozen=True, slots=True)
class LaneDepth:
    """One lane's work that is due now: how many, and how long the oldest has waited."""

    depth: int
    oldest_due_age_seconds: float


@dataclass(frozen=True, slots=True)
class KubeLink:
    """A Notification object and the row it became."""

    uid: str
    namespace: str
    name: str
    notification_id: uuid.UUID
    generation: int
    # Other objects linked to the same row (the same explicit idempotencyKey and request).
    other_links: int = 0


@dataclass(frozen=True, slots=True)
class StatusChange:
    """Queued changes of one object's notification, coalesced: what its status should show now."""

    uid: str
    namespace: str
    name: str
    outbox_seqs: tuple[int, ...]
    # Statuses the row moved into since the last write-back (for Events), e.g. DEAD_LETTERED.
    entered_statuses: frozenset[Status]
    # False: the object is gone (its link was deleted); nothing to write, the rows just go.
    linked: bool
    generation: int | None
    notification: Notification | None
    # When the row reached its final status (None: not final); drives lastTransitionTime.
    finished_at: datetime | None = None
    # False while the row's NotificationPolicy exists but is not Ready (the row is held).
    policy_ready: bool = True
    # False when no NotificationPolicy of the row's name is mirrored (the defaults apply).
    policy_exists: bool = True
    # Every notification a recipientId request became (the linked one included); else empty.
    related: tuple[uuid.UUID, ...] = ()
    # With spec.escalation: the escalation's id and state (status.escalation); `related` then
    # holds its steps in order.
    escalation: EscalationStatus | None = None


@dataclass(frozen=True, slots=True)
class EscalationStatus:
    id: uuid.UUID
    state: EscalationState
    step_ids: tuple[uuid.UUID, ...]


class StatusOutboxBatch:
    """A batch taken under the writer lock; `delete` the seqs written back before it ends."""

    def __init__(self, conn: Connection, changes: list[StatusChange]) -> None:
        self._conn = conn
        self.changes = changes

    async def delete(self, seqs: Sequence[int]) -> None:
        if seqs:
            await self._conn.execute("status_outbox_delete", {"seqs": list(seqs)})


def _link_from_row(row: dict[str, Any]) -> KubeLink:
    return KubeLink(
        uid=row["uid"],
        namespace=row["namespace"],
        name=row["name"],
        notification_id=row["notification_id"],
        generation=int(row["generation"]),
        other_links=int(row["other_links"]),
    )


def _change_from_row(row: dict[str, Any]) -> StatusChange:
    return StatusChange(
        uid=row["object_uid"],
        namespace=row["object_namespace"],
        name=row["object_name"],
        outbox_seqs=tuple(row["outbox_seqs"]),
        entered_statuses=frozenset(Status(s) for s in row["entered_statuses"]),
        linked=bool(row["object_linked"]),
        generation=row["object_generation"],
        notification=notification_from_row(row) if row["id"] is not None else None,
        finished_at=row["finished_at"],
        policy_ready=bool(row["object_policy_ready"]),
        policy_exists=bool(row["object_policy_exists"]),
        related=tuple(row["related_ids"] or ()),
    )


async def _with_deliveries(conn: Connection, changes: list[StatusChange]) -> None:
    """Give SENT notifications their delivery receipt (docs/receipts.md): one more query per
    batch, and only for batches that hold SENT rows."""
    sent = {
        c.notification.id: c.notification
        for c in changes
        if c.notification is not None and c.notification.status is Status.SENT
    }
    if not sent:
        return
    for r in await conn.fetch_all("delivery_receipts_get", {"ids": list(sent)}):
        sent[r["notification_id"]].delivery = Delivery(r["state"], r["at"], r["reason"])


async def _with_escalations(conn: Connection, changes: list[StatusChange]) -> list[StatusChange]:
    """Add their escalation to the changes of objects whose row is an escalation's step: one
    more query per batch, and only for batches that hold such objects."""
    steps = [
        c.notification
        for c in changes
        if c.notification is not None
        and c.notification.escalation_id is not None
        and c.notification.recipient_id is not None
    ]
    if not steps:
        return changes
    rows = await conn.fetch_all(
        "kube_escalation_states",
        {
            "recipient_ids": [n.recipient_id for n in steps],
            "ids": [n.escalation_id for n in steps],
        },
    )
    found = {
        r["id"]: EscalationStatus(
            id=r["id"], state=EscalationState(r["state"]), step_ids=tuple(r["step_ids"])
        )
        for r in rows
    }
    out = []
    for c in changes:
        e = found.get(c.notification.escalation_id) if c.notification is not None else None
        out.append(c if e is None else replace(c, escalation=e, related=e.step_ids))
    return out


class KubeRepository:
    def __init__(self, db: Database) -> None:
        self._db = db
        # The statements' shape follows the engine (docs/scaling.md), read at most once per TTL.
        self._engine = EngineRepository(db)

    # --- links ----------------------------------------------------------------------------

    async def kube_link_get(self, *, uid: str) -> KubeLink | None:
        row = await self._db.fetch_one("kube_link_get", {"uid": uid})
        return None if row is None else _link_from_row(row)

    async def kube_link_save(
        self, *, uid: str, namespace: str, name: str, notification_id: uuid.UUID, generation: int
    ) -> None:
        """Link the object to its row and queue its first status write (idempotent)."""
        params: KubeLinkSave = {
            "uid": uid,
            "namespace": namespace,
            "name": name,
            "notification_id": notification_id,
            "generation": generation,
        }
        await (await self._engine.driver()).kube_link_save(self._db, params)

    async def kube_link_uids(self, *, namespace: str | None) -> set[str]:
        rows = await self._db.fetch_all("kube_link_uids", {"namespace": namespace})
        return {row["uid"] for row in rows}

    async def kube_link_delete(self, *, uid: str) -> None:
        await self._db.execute("kube_link_delete", {"uid": uid})

    # --- status outbox ----------------------------------------------------------------------

    @asynccontextmanager
    async def status_outbox_batch(
        self, *, namespace: str | None, limit: int
    ) -> AsyncIterator[StatusOutboxBatch | None]:
        """The oldest queued changes of `namespace` (None: all), coalesced per object.

        Yields None when another writer holds the lock for this scope. The transaction (and the
        lock) lasts until the block ends, so keep the block to one batch of patches.
        """
        async with self._db.transaction() as conn:
            locked = await conn.fetch_one("status_outbox_lock", {"namespace": namespace})
            if not locked or not locked["locked"]:
                yield None
                return
            driver = await self._engine.driver(conn=conn)
            rows = await driver.status_outbox_take(conn, {"namespace": namespace, "limit": limit})
            changes = await _with_escalations(conn, [_change_from_row(r) for r in rows])
            await _with_deliveries(conn, changes)
            yield StatusOutboxBatch(conn, changes)

    async def status_outbox_lag(self, *, namespace: str | None) -> tuple[int, float]:
        """(queued changes, age in seconds of the oldest)."""
        row = await self._db.fetch_one("status_outbox_lag", {"namespace": namespace})
        assert row is not None
        return int(row["queued"]), float(row["oldest_age_seconds"])

    async def status_outbox_wakeups(self, stop: asyncio.Event) -> AsyncIterator[None]:
        """One item per NOTIFY from the outbox trigger, and one after each (re)connect."""
        async for _ in self._db.listen((STATUS_OUTBOX_CHANNEL,), stop):
            yield None

    # --- waiting refresh (operator/refresh.py) --------------------------------------------

    async def waiting_refresh_next(self) -> tuple[datetime | None, datetime]:
        """When the next Kubernetes notification's waiting reason runs out, and the database's
        now."""
        row = await self._db.fetch_one("waiting_refresh_next")
        assert row is not None
        return row["next_until"], row["now"]

    async def waiting_refresh_queue(
        self, *, after: datetime, upto: datetime, lanes: Lanes, namespace: str | None
    ) -> int:
        """Queue a status write for each object whose notification's reason ran out in (after,
        upto], or that waits for a worker only in `lanes`; return how many were queued."""
        rows = await self._db.fetch_all("waiting_refresh_passed", {"after": after, "upto": upto})
        if lanes:
            rows += await self._db.fetch_all("waiting_refresh_lanes", {"lanes": lane_keys(lanes)})
        if not rows:
            return 0
        queued = await self._db.fetch_one(
            "waiting_refresh_queue", {"ids": [r["id"] for r in rows], "namespace": namespace}
        )
        return int(queued["queued"]) if queued is not None else 0

    # --- TTL sweep ---------------------------------------------------------------------------

    async def kube_finished_take_due(self, *, namespace: str | None, limit: int) -> list[KubeLink]:
        driver = await self._engine.driver()
        rows = await driver.kube_finished_take_due(
            self._db, {"namespace": namespace, "limit": limit}
        )
        return [_link_from_row(r) for r in rows]

    async def kube_finished_next_due(self, *, namespace: str | None) -> float | None:
        """Seconds until the next TTL runs out (≤ 0: overdue), or None when none is waiting."""
        row = await self._db.fetch_one("kube_finished_next_due", {"namespace": namespace})
        return None if row is None or row["seconds"] is None else float(row["seconds"])

    # --- scaling ------------------------------------------------------------------------------

    async def lane_depths(self) -> dict[tuple[Priority, Channel], LaneDepth]:
        """Per lane (priority, channel): due now and not expired, and the oldest's age."""
        rows = await self._db.fetch_all("lane_depths")
        return {
            (Priority.from_rank(r["priority"]), Channel(r["channel"])): LaneDepth(
                int(r["depth"]), float(r["oldest_due_age_seconds"])
            )
            for r in rows
        }
