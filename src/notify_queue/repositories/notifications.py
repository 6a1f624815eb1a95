"""Notifications as the API and the operator see them: enqueue, read, list, cancel, retry."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, TypedDict

from notify_queue import jsontext
from notify_queue.models import (
    DEFAULT_TENANT,
    Delivery,
    DigestRef,
    NewNotification,
    Notification,
    Priority,
    ProviderCircuit,
    QueueStatus,
    Recipient,
    Status,
    Template,
    WaitingReason,
    stored_key,
)
from notify_queue.repositories import receipts
from notify_queue.repositories.db import Connection, Database
from notify_queue.repositories.driver import NotificationCancel
from notify_queue.repositories.engine import EngineRepository
from notify_queue.repositories.rows import (
    enqueued_notifications,
    notification_from_row,
    recipient_from_row,
    template_from_row,
)
from notify_queue.repositories.workers import Lanes, WorkerRepository, lane_keys


class NotificationPage(TypedDict):
    """`notification_list` (and its `_waiting`, `_unserved` forms): the filters (None: any) and
    the page after the keyset (`after_created_at`, `after_id`)."""

    status: str | None
    channel: str | None
    recipient: str | None
    recipient_id: str | None
    after_created_at: datetime | None
    after_id: uuid.UUID | None
    limit: int


class NotificationRepository:
    def __init__(self, db: Database, *, default_webhook_url: str | None = None) -> None:
        self._db = db
        # For the event of a notification born SUPPRESSED (--webhook-url).
        self._default_webhook_url = default_webhook_url
        # For /status: the engine, read at most once per TTL by this process.
        self._engine = EngineRepository(db)
        # The workers' heartbeats, on the same database (`NoWorker`).
        self.workers = WorkerRepository(db)

    async def _born_suppressed(
        self, notifications: Sequence[NewNotification], conn: Connection | None
    ) -> Sequence[NewNotification]:
        """The batch with those to a suppressed address born SUPPRESSED, `lastError` saying
        why (docs/receipts.md): nothing will ever call a provider for them. One read."""
        found = await receipts.suppressions_find(
            conn or self._db,
            pairs=list(
                {
                    (n.channel.value, n.recipient)
                    for n in notifications
                    if n.status is Status.PENDING
                }
            ),
        )
        if not found:
            return notifications
        return [
            dataclasses.replace(n, status=Status.SUPPRESSED, last_error=f"suppressed: {reason}")
            if n.status is Status.PENDING
            and (reason := found.get((n.channel.value, n.recipient))) is not None
            else n
            for n in notifications
        ]

    @asynccontextmanager
    async def targeted_transaction(
        self, *, request_keys: Sequence[str]
    ) -> AsyncIterator[TargetedTransaction]:
        """One transaction for expanding user-targeted requests, serialised per request key."""
        async with self._db.transaction() as conn:
            await conn.fetch_one("notification_lock_request_keys", {"keys": list(request_keys)})
            yield TargetedTransaction(conn, self)

    async def notifications_insert(
        self,
        *,
        notifications: Sequence[NewNotification],
        default_max_attempts: int,
        conn: Connection | None = None,
        wake: bool = False,
    ) -> list[Notification]:
        """Insert the batch; return the rows inserted (absent: the key already existed).

        `wake`: the workers' wake-up is sent at the insert's commit, in its transaction, when it
        inserted a row (the caller's debounced waker decided one is due); else none is sent."""
        if not notifications:
            return []
        born_final = any(n.status is not Status.PENDING for n in notifications)
        digests = any(n.digest is not None for n in notifications)
        if not born_final and not digests:
            # The common batch: every row PENDING. Only what the server decides comes back
            # (nq_enqueue_pending), read in binary; the rest is the request's.
            pending = [enqueue_item(i, n) for i, n in enumerate(notifications)]
            params = {
                "items": jsontext.dumps_text(pending),
                "default_max_attempts": default_max_attempts,
                "wake": wake,
            }
            (row,) = await (conn or self._db).fetch_all(
                "notification_enqueue_pending", params, binary=True, prepare=True
            )
            if not row["suppressed"]:
                return enqueued_notifications(notifications, row)
        # An address on the suppression list (the common batch's statement found one and
        # inserted nothing, or a batch of the general way): those are born SUPPRESSED.
        notifications = await self._born_suppressed(notifications, conn)
        born_final = any(n.status is not Status.PENDING for n in notifications)
        items = [
            {
                **enqueue_item(position, n),
                "status": n.status.value,
                "last_error": n.last_error,
                # Digests (0009): only set for an item of one; a plain row sends nulls.
                **(
                    {
                        "digest_key": n.digest.key,
                        "digest_window_seconds": n.digest.window_seconds,
                        "digest_max_items": n.digest.max_items,
                        "digest_template": n.digest.template,
                    }
                    if n.digest is not None
                    else {}
                ),
            }
            for position, n in enumerate(notifications)
        ]
        params = {
            # One JSON document for the whole batch (see the query).
            "items": jsontext.dumps_text(items),
            "default_max_attempts": default_max_attempts,
            "default_webhook_url": self._default_webhook_url,
        }
        if conn is not None:
            return await _insert(conn, params, born_final=born_final, digests=digests, wake=wake)
        async with self._db.transaction() as own:
            return await _insert(own, params, born_final=born_final, digests=digests, wake=wake)

    async def notifications_get_by_keys(
        self, *, idempotency_keys: Sequence[str], conn: Connection | None = None
    ) -> dict[str, tuple[Notification, str]]:
        """Existing rows by idempotency key, each with the hash of the request that created it."""
        rows = await (conn or self._db).fetch_all(
            "notification_get_by_keys", {"idempotency_keys": list(idempotency_keys)}
        )
        found = await _notifications(conn or self._db, rows)
        return {
            r["idempotency_key"]: (n, r["request_hash"]) for r, n in zip(rows, found, strict=True)
        }

    async def templates_get(self, *, names: Sequence[str]) -> dict[str, Template]:
        rows = await self._db.fetch_all("template_get_many", {"names": list(names)})
        return {r["name"]: template_from_row(r) for r in rows}

    async def notification_get(self, *, id: uuid.UUID) -> Notification | None:
        row = await self._db.fetch_one("notification_get", {"id": id})
        return None if row is None else (await _notifications(self._db, [row]))[0]

    async def notifications_list(
        self,
        *,
        status: Status | None,
        channel: str | None,
        recipient: str | None,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
        recipient_id: str | None = None,
        waiting: WaitingReason | None = None,
        unserved: Lanes = frozenset(),
    ) -> list[Notification]:
        """A page in (created_at, id) order; with `waiting`, only rows waiting for that reason
        now (a query of its own over the queue: only PENDING rows wait). `NoWorker` rows are
        the due ones in the `unserved` lanes."""
        params: NotificationPage = {
            "status": status.value if status else None,
            "channel": channel,
            "recipient": recipient,
            "recipient_id": recipient_id,
            "after_created_at": after[0] if after else None,
            "after_id": after[1] if after else None,
            "limit": limit,
        }
        # Each statement named at its call (the security test reads the names from the code).
        if waiting is None:
            rows = await self._db.fetch_all("notification_list", params)
        elif waiting is WaitingReason.NO_WORKER:
            if not unserved:
                return []
            rows = await self._db.fetch_all(
                "notification_list_unserved", params | {"lanes": lane_keys(unserved)}
            )
        else:
            rows = await self._db.fetch_all(
                "notification_list_waiting", params | {"waiting": waiting.value}
            )
        return await _notifications(self._db, rows)

    async def notification_cancel(self, *, id: uuid.UUID) -> Notification | None:
        """CANCELLED if it was PENDING; None when it was not (or does not exist)."""
        params: NotificationCancel = {"id": id, "default_webhook_url": self._default_webhook_url}
        driver = await self._engine.driver()
        async with self._db.transaction() as conn:
            await conn.fetch_one("notification_log_ready")
            return await _get(conn, id) if await driver.notification_cancel(conn, params) else None

    async def notification_retry(self, *, id: uuid.UUID) -> Notification | None:
        driver = await self._engine.driver()
        async with self._db.transaction() as conn:
            return await _get(conn, id) if await driver.notification_retry(conn, id) else None

    async def notifications_retry_batch(self, *, status: Status, limit: int) -> tuple[int, int]:
        """Retry up to `limit` in `status`, oldest first; return (retried, remaining)."""
        driver = await self._engine.driver()
        return await driver.notifications_retry_batch(self._db, status=status.value, limit=limit)

    async def workers_wake(self) -> None:
        await self._db.execute("notification_wake_workers")

    async def queue_status(
        self, *, waiting: bool = False, unserved: Lanes = frozenset()
    ) -> QueueStatus:
        """The queue now; with `waiting` the count per reason, `NoWorker` in `unserved` lanes."""
        async with self._db.connection() as conn:
            counts = await conn.fetch_all("queue_status_counts")
            due = await conn.fetch_all("queue_status_due")
            hooks = await conn.fetch_all("queue_status_webhooks")
            circuits = await conn.fetch_all("provider_circuits_read")
            waits = await conn.fetch_all("queue_status_waiting") if waiting else []
            # /metrics only, like the waiting reasons.
            suppressions = await conn.fetch_all("suppressions_count") if waiting else []
            if waiting and unserved:
                row = await conn.fetch_one("queue_status_unserved", {"lanes": lane_keys(unserved)})
                waits.append({"reason": WaitingReason.NO_WORKER, "n": row["n"] if row else 0})
            now = (await conn.fetch_one("database_now") or {})["now"]
            engine = await self._engine.engine_get(conn=conn)
        oldest = min((r["oldest_due"] for r in due), default=None)
        by_priority = {
            Priority.from_rank(r["priority"]): max((now - r["oldest_due"]).total_seconds(), 0.0)
            for r in due
        }
        return QueueStatus(
            counts={s: 0 for s in Status} | {Status(r["status"]): int(r["n"]) for r in counts},
            due={p: 0 for p in Priority}
            | {Priority.from_rank(r["priority"]): int(r["n"]) for r in due},
            oldest_due_age_seconds=max((now - oldest).total_seconds(), 0.0) if oldest else 0.0,
            oldest_due_age_by_priority={p: 0.0 for p in Priority} | by_priority,
            webhook_events={"pending": 0, "delivered": 0, "failed": 0}
            | {r["state"]: int(r["n"]) for r in hooks},
            providers={
                r["provider"]: ProviderCircuit(
                    r["state"], r["open_until"] if r["state"] != "closed" else None
                )
                for r in circuits
            },
            database=engine,
            waiting={r: 0 for r in WaitingReason}
            | {WaitingReason(r["reason"]): int(r["n"]) for r in waits},
            suppressions={r["channel"]: int(r["n"]) for r in suppressions},
        )


async def _insert(
    conn: Connection,
    params: dict[str, object],
    *,
    born_final: bool,
    digests: bool = False,
    wake: bool = False,
) -> list[Notification]:
    if born_final:
        await conn.fetch_one("notification_log_ready")
    if digests:  # docs/digests.md: only a batch with a digest's item plans the digest steps
        rows = await conn.fetch_all("notification_insert_many_digests", params, binary=True)
    else:
        rows = await conn.fetch_all("notification_insert_many", params, binary=True)
    if wake and rows:  # in the insert's transaction: sent at its commit
        await conn.execute("notification_wake_workers")
    return await _notifications(conn, rows)


def enqueue_item(position: int, n: NewNotification) -> dict[str, Any]:
    """One notification of an enqueue batch as its JSON object (the statements' json_to_recordset
    names these fields). A field that is NULL is left out rather than written as `null`: the
    server reads a missing field as NULL, and each field it parses costs it
    (`benchmarks.probes.itemshapes` measures it)."""
    item = {
        "position": position,
        "id": n.id,  # written by the JSON encoder (orjson, in C)
        "idempotency_key": stored_key(n.tenant, n.idempotency_key),
        "request_hash": n.request_hash,
        "channel": str(n.channel),  # a StrEnum's value, without enum's Python property
        "recipient": n.recipient,
        "body": n.body,
        "priority": n.priority.rank,
        # Written as RFC 3339 by the JSON encoder (orjson: far cheaper than isoformat).
        "send_at": n.send_at,
        "source": str(n.source),
        "metadata": n.metadata,
        "category": n.category,
    }
    if n.subject is not None:
        item["subject"] = n.subject
    if n.expires_at is not None:
        item["expires_at"] = n.expires_at
    if n.policy is not None:
        item["policy"] = n.policy
    if n.webhook_url is not None:
        item["webhook_url"] = n.webhook_url
    if n.recipient_id is not None:
        item["recipient_id"] = n.recipient_id
    if n.template is not None:
        item["template_name"] = n.template.name
        item["template_version"] = n.template.version
    if n.traceparent is not None:
        item["traceparent"] = n.traceparent
    if n.tenant != DEFAULT_TENANT:
        item["tenant"] = n.tenant
    return item


async def _get(conn: Connection, id: uuid.UUID) -> Notification | None:
    """A statement of its own: it sees what the transaction's earlier statements moved."""
    row = await conn.fetch_one("notification_get", {"id": id})
    return None if row is None else (await _notifications(conn, [row]))[0]


async def _notifications(
    executor: Database | Connection, rows: Sequence[dict[str, Any]]
) -> list[Notification]:
    """Rows as notifications; those of a digest with `digest`, SENT ones with their `delivery`
    receipt (one more read each, only when there are such rows)."""
    found = [notification_from_row(r) for r in rows]
    sent = [n.id for n in found if n.status is Status.SENT]
    if sent:
        receipts = await executor.fetch_all("delivery_receipts_get", {"ids": sent})
        by_id = {r["notification_id"]: Delivery(r["state"], r["at"], r["reason"]) for r in receipts}
        for n in found:
            n.delivery = by_id.get(n.id)
    digested = [r for r in rows if r.get("digest_id") is not None]
    if not digested:
        return found
    refs = await executor.fetch_all(
        "digest_refs",
        {
            "buckets": sorted({r["bucket"] for r in digested}),
            "ids": sorted({r["digest_id"] for r in digested}),
        },
    )
    by_ref = {r["id"]: DigestRef(key=r["key"], id=r["id"], count=r["item_count"]) for r in refs}
    return [
        dataclasses.replace(n, digest=by_ref.get(r["digest_id"]))
        if r.get("digest_id") is not None
        else n
        for n, r in zip(found, rows, strict=True)
    ]


class TargetedTransaction:
    """The reads and the insert of user-targeted requests, inside one transaction."""

    def __init__(self, conn: Connection, repository: NotificationRepository) -> None:
        self._conn = conn
        self._repository = repository

    async def notifications_get_by_keys(
        self, *, idempotency_keys: Sequence[str]
    ) -> dict[str, tuple[Notification, str]]:
        return await self._repository.notifications_get_by_keys(
            idempotency_keys=idempotency_keys, conn=self._conn
        )

    async def recipients_get(self, *, ids: Sequence[str]) -> dict[str, Recipient]:
        rows = await self._conn.fetch_all("recipient_get_many", {"ids": list(ids)})
        return {r["id"]: recipient_from_row(r) for r in rows}

    async def templates_get(self, *, names: Sequence[str]) -> dict[str, Template]:
        rows = await self._conn.fetch_all("template_get_many", {"names": list(names)})
        return {r["name"]: template_from_row(r) for r in rows}

    async def notifications_insert(
        self, *, notifications: Sequence[NewNotification], default_max_attempts: int
    ) -> list[Notification]:
        return await self._repository.notifications_insert(
            notifications=notifications,
            default_max_attempts=default_max_attempts,
            conn=self._conn,
        )
