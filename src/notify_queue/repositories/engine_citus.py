"""The Citus driver: a lock-free multi-shard look finds the buckets, then a router statement per
bucket locks and writes (citus/statements.sql; docs/scaling.md, "Citus: every role").

What a function delegated to a bucket's node cannot write there (the status outbox and its
NOTIFY, the Kubernetes links, a reference table's rows) it returns, and the helpers at the end of
this module write it on the coordinator, in the caller's transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from notify_queue.models import Completion, Engine, Status
from notify_queue.repositories import driver
from notify_queue.repositories.db import Connection, Database, Row


class CitusDriver:
    engine = Engine.CITUS

    async def rate_windows_prune(self, db: Database, params: driver.RateWindowsPrune) -> int:
        """All of them in one multi-shard DELETE (see the statement)."""
        return await db.execute("prune_rate_windows_citus", params)

    async def deliveries_complete(
        self, db: Database, results: Sequence[Completion], params_of: driver.ParamsOf
    ) -> driver.Recorded:
        """The rows' buckets first (one lock-free look), then one delegated call per bucket, each
        its own transaction (a result is independent of the others, as it is on plain
        PostgreSQL's one statement) with its coordinator writes."""
        by_id = {c.id: c for c in results}
        accepted: set[uuid.UUID] = set()
        async with db.connection() as conn:
            await conn.fetch_one("notification_log_ready")  # today's partition, as the claim
            for part in await conn.fetch_all("citus_job_buckets", {"ids": list(by_id)}):
                params = params_of([by_id[i] for i in part["ids"]])
                async with conn.transaction():
                    done, _ = await self.deliveries_record(conn, params, part["bucket"])
                accepted |= done
        # The delegated completion does not say whether it wrote events: any accepted final
        # result may have one.
        return accepted, any(by_id[i].status is not Status.PENDING for i in accepted)

    async def deliveries_record(
        self, conn: Connection, params: driver.DeliveriesComplete, bucket: int | None
    ) -> driver.Recorded:
        """The function delegated to the bucket's node; what it cannot write there (the
        coordinator's outbox and its NOTIFY, a reference table) is written here, in the caller's
        transaction, so it commits with the completion."""
        row = await conn.fetch_one("complete_deliveries_bucket", {**params, "bucket": bucket})
        if row is None:
            return set(), False
        await citus_queue_returned_changes(conn, row)
        if row["gone_recipient_ids"]:
            await conn.execute(
                "citus_push_tokens_gone",
                {"recipient_ids": row["gone_recipient_ids"], "tokens": row["gone_tokens"]},
            )
        return set(row["accepted_ids"]), True

    async def claims_release(self, db: Database, params: driver.ClaimsRelease) -> int:
        tokens = dict(zip(params["ids"], params["claim_tokens"], strict=True))
        released = 0
        async with db.connection() as conn:
            for part in await conn.fetch_all("citus_job_buckets", {"ids": params["ids"]}):
                # The release and its objects' outbox rows in one transaction; the note on the
                # coordinator (citus/statements.sql: the router statement is sent whole to the
                # node).
                async with conn.transaction():
                    row = await conn.fetch_one(
                        "release_claims_bucket",
                        {
                            "bucket": part["bucket"],
                            "ids": part["ids"],
                            "claim_tokens": [tokens[i] for i in part["ids"]],
                        },
                    )
                    if row and row["kubernetes_ids"]:
                        ids = row["kubernetes_ids"]
                        await conn.fetch_one(
                            "citus_note_changes",
                            {
                                "ids": ids,
                                "sources": ["kubernetes"] * len(ids),
                                "old_statuses": [Status.PROCESSING.value] * len(ids),
                                "new_statuses": [Status.PENDING.value] * len(ids),
                            },
                        )
                released += int(row["released"]) if row else 0
        return released

    async def leases_recover_expired(
        self, db: Database, params: driver.HousekeepingBatch
    ) -> tuple[int, int]:
        recovered = dead = 0
        async with db.connection() as conn:
            await log_ready(conn)
            for part in await conn.fetch_all("lease_expired_buckets", params):
                # Delegated to the bucket's node; the outbox written here, in one transaction.
                async with conn.transaction():
                    row = await conn.fetch_one(
                        "recover_expired_leases_bucket", {**params, "bucket": part["bucket"]}
                    )
                    await citus_queue_returned_changes(conn, row)
                if row:
                    recovered += int(row["recovered"])
                    dead += int(row["dead_lettered"])
        return recovered, dead

    async def notifications_expire_overdue(
        self, db: Database, params: driver.HousekeepingBatch
    ) -> int:
        expired = 0
        async with db.connection() as conn:
            await log_ready(conn)
            for part in await conn.fetch_all("overdue_buckets", params):
                # Locked by bucket, moved on the coordinator, in one transaction
                # (citus/statements.sql).
                async with conn.transaction():
                    overdue = await conn.fetch_all(
                        "expire_overdue_bucket", {**params, "bucket": part["bucket"]}
                    )
                    if overdue:
                        await citus_finish(
                            conn,
                            bucket=part["bucket"],
                            ids=[r["id"] for r in overdue],
                            status=Status.EXPIRED,
                            last_errors=[r["last_error"] for r in overdue],
                            default_webhook_url=params["default_webhook_url"],
                        )
                expired += len(overdue)
        return expired

    async def webhook_events_claim(self, db: Database, params: driver.WebhookClaim) -> list[Row]:
        # The buckets of the most urgent due events (lock-free), then one routed claim per
        # bucket of as many events as it holds among them, until the limit.
        limit = params["limit"]
        rows: list[Row] = []
        async with db.connection() as conn:
            for part in await conn.fetch_all("webhook_due_buckets", {"limit": limit}):
                take = min(int(part["n"]), limit - len(rows))
                if take <= 0:
                    break
                rows += [
                    r
                    for r in await conn.fetch_all(
                        "webhook_claim_due_bucket",
                        {**params, "limit": take, "bucket": part["bucket"]},
                    )
                    if r["id"] is not None
                ]
        return rows

    async def notification_cancel(
        self, conn: Connection, params: driver.NotificationCancel
    ) -> bool:
        id = params["id"]
        webhook_url = params["default_webhook_url"]
        # The row's bucket first (lock-free), so the cancel's lock routes; none: it is not in
        # the queue (finished, or no such id).
        found = await conn.fetch_all("citus_job_buckets", {"ids": [id]})
        if not found:
            return False
        bucket = found[0]["bucket"]
        locked = await conn.fetch_one("notification_cancel_bucket", {**params, "bucket": bucket})
        if locked is not None and await citus_finish(
            conn, bucket=bucket, ids=[id], status=Status.CANCELLED, default_webhook_url=webhook_url
        ):
            return True
        # A digest's item (docs/digests.md), in three statements, so nq_finish_held stays on the
        # coordinator (citus/statements.sql): the item locked, moved, then the digest updated.
        digest = await conn.fetch_one("digest_cancel_lock_bucket", {"id": id, "bucket": bucket})
        if digest is None or digest["state"] != "open":
            return False
        leave = {**params, "bucket": digest["bucket"], "digest_id": digest["id"]}
        if await conn.fetch_one("digest_item_cancel_bucket", leave) is None:
            return False
        left = await citus_finish(
            conn,
            bucket=digest["bucket"],
            ids=[id],
            status=Status.CANCELLED,
            default_webhook_url=webhook_url,
        )
        if left is None or left["id"] is None:
            return False
        await conn.fetch_one("digest_item_leave_bucket", leave)
        return True

    async def notification_retry(self, conn: Connection, id: uuid.UUID) -> bool:
        """nq_retry in three routed steps (citus/statements.sql): the log row locked in its
        bucket, its key held, the row moved back to the queue."""
        found = await conn.fetch_all("citus_log_buckets", {"ids": [id]})
        if not found:
            return False
        ids = {"bucket": found[0]["bucket"], "ids": [id]}
        locked = await conn.fetch_all("notification_retry_lock_bucket", ids)
        if not locked:
            return False
        key = await conn.fetch_one(
            "notification_retry_lock_key", {"key": locked[0]["idempotency_key"], "id": id}
        )
        if key is None:
            return False
        return bool(await conn.fetch_all("notification_retry_move_bucket", ids))

    async def notifications_retry_batch(
        self, db: Database, *, status: str, limit: int
    ) -> tuple[int, int]:
        # The oldest rows picked without locks, then each retried in its own transaction by the
        # routed steps (a row another retry took first is skipped).
        picked = await db.fetch_all("notification_retry_pick", {"status": status, "limit": limit})
        retried = 0
        for p in picked:
            async with db.transaction() as conn:
                retried += await self.notification_retry(conn, p["id"])
        left = await db.fetch_one("notification_status_count", {"status": status})
        return retried, max(int(left["n"]) if left else 0, 0)

    async def escalation_acknowledge(
        self, db: Database, params: driver.EscalationAcknowledge
    ) -> bool:
        """The bucket first (lock-free), so every lock names one shard, the escalation's and its
        steps'; the mark commits in a transaction of its own, then the steps are stopped in a
        second one (docs/scaling.md: one transaction for both crashed a worker node in COMMIT
        PREPARED under Citus 14.0.1). The mark alone is the acknowledgement: from its commit on
        the claim cancels any step it would hand out (the escalation guard), so a second
        transaction that fails loses nothing but the early CANCELLED, which a repeated
        acknowledgement or the step's claim writes."""
        async with db.transaction() as conn:
            found = await conn.fetch_one("escalation_buckets", params)
            if found is None:
                return False
            bucket = {"id": params["id"], "bucket": found["bucket"]}
            locked = await conn.fetch_one("escalation_acknowledge_lock_bucket", bucket)
            if locked is None:
                return False
            if locked["acknowledged_at"] is None:
                await conn.execute("escalation_acknowledge_mark", {**bucket, "by": params["by"]})
        async with db.transaction() as conn:
            locked = await conn.fetch_one("escalation_acknowledge_lock_bucket", bucket)
            if locked is None:
                return True
            await log_ready(conn)
            pending = await conn.fetch_all(
                "escalation_steps_stop_bucket",
                {"ids": locked["step_ids"], "bucket": locked["bucket"]},
            )
            if pending:
                await citus_finish(
                    conn,
                    bucket=locked["bucket"],
                    ids=[r["id"] for r in pending],
                    status=Status.CANCELLED,
                    last_errors=["acknowledged"] * len(pending),
                    default_webhook_url=params["default_webhook_url"],
                )
            await conn.fetch_one("escalation_note_objects", {"ids": locked["step_ids"]})
        return True

    async def kube_link_save(self, db: Database, params: driver.KubeLinkSave) -> None:
        """The link in a transaction of its own, then the row locked by bucket and its status
        queued (citus/statements.sql, kube_link_save_citus, says why no change slips between the
        two). A failure between them leaves a link without its first status write; kopf runs the
        create handler again, which saves both again."""
        found = await db.fetch_one("kube_link_bucket_citus", params)
        if found is None:
            return  # no such row (as plain PostgreSQL: nothing linked)
        await db.execute("kube_link_save_citus", params)
        locked = {**params, "bucket": found["bucket"]}
        async with db.transaction() as conn:
            row = await conn.fetch_one("kube_link_lock_queued_bucket", locked)
            if row is None:
                row = await conn.fetch_one("kube_link_lock_logged_bucket", locked)
            if row is not None:
                await conn.fetch_one(
                    "kube_link_status_queue_citus", {**params, "status": row["status"]}
                )

    async def status_outbox_take(
        self, conn: Connection, params: driver.StatusOutboxTake
    ) -> list[Row]:
        """The objects from the outbox and links (coordinator tables), then their notifications
        by id, then the related rows of recipientId requests; merged into the plain statement's
        row shape."""
        objects = await conn.fetch_all("status_outbox_take_citus", params)
        if not objects:
            return []
        found = await conn.fetch_all(
            "status_outbox_notifications_citus",
            {"ids": list({o["object_notification_id"] for o in objects})},
        )
        by_id = {n["id"]: n for n in found}
        targeted = [n for n in found if n["recipient_id"] is not None]
        related: dict[uuid.UUID, list[uuid.UUID]] = {}
        if targeted:
            rows = await conn.fetch_all(
                "status_outbox_related_citus",
                {
                    "ids": [n["id"] for n in targeted],
                    "idempotency_keys": [n["idempotency_key"] for n in targeted],
                },
            )
            related = {r["id"]: r["related_ids"] for r in rows}
        missing = dict.fromkeys(found[0] if found else ("id", "finished_at", "recipient_id"))
        out: list[Row] = []
        for o in objects:
            n = by_id.get(o["object_notification_id"])
            row: Row = {
                **missing,
                "object_policy_ready": True,
                "object_policy_exists": True,
                **(n or {}),
                **o,
            }
            # As the plain statement: the list for recipientId rows (empty when no key matched).
            row["related_ids"] = (
                related.get(n["id"], [])
                if n is not None and n["recipient_id"] is not None
                else None
            )
            out.append(row)
        return out

    async def kube_finished_take_due(
        self, db: Database, params: driver.StatusOutboxTake
    ) -> list[Row]:
        return await db.fetch_all("kube_finished_take_due_citus", params)

    async def delivery_log_forget_keys(
        self, conn: Connection, params: driver.LogKeysChunk
    ) -> Row | None:
        """Without the lock on the partition's rows."""
        return await conn.fetch_one("delivery_log_forget_keys_unlocked", params)

    async def delivery_log_detach(self, conn: Connection, *, partition: str) -> None:
        """A plain DETACH: Citus refuses CONCURRENTLY."""
        await conn.execute_on("delivery_log_detach_citus", {"partition": partition})


async def log_ready(conn: Connection) -> None:
    """Today's log partition, which nq_finish_held makes on plain PostgreSQL: a delegated move
    runs on a worker node, where no partition can be created (DDL)."""
    await conn.fetch_one("notification_log_ready")


async def citus_finish(
    conn: Connection,
    *,
    bucket: int,
    ids: Sequence[uuid.UUID],
    status: Status,
    last_errors: Sequence[str] | None = None,
    default_webhook_url: str | None,
) -> Row | None:
    """Move rows of `bucket` that a router statement of `conn`'s transaction locked into the log
    with `status` (nq_finish_bucket, delegated to the bucket's node), and queue the Kubernetes
    objects' status writes on the coordinator in the same transaction; the first moved row, or
    None."""
    rows = await conn.fetch_all(
        "citus_finish",
        {
            "bucket": bucket,
            "ids": list(ids),
            "statuses": [status.value] * len(ids),
            "last_errors": None if last_errors is None else list(last_errors),
            "default_webhook_url": default_webhook_url,
        },
    )
    kube = [r for r in rows if r["source"] == "kubernetes"]
    if kube:
        await citus_status_outbox_queue(
            conn,
            [r["id"] for r in kube],
            [r["old_status"] for r in kube],
            [r["status"] for r in kube],
        )
    return rows[0] if rows else None


async def citus_status_outbox_queue(
    conn: Connection, ids: Sequence[uuid.UUID], old: Sequence[str], new: Sequence[str]
) -> None:
    """The status writes of Kubernetes objects' rows that a delegated function changed, on the
    coordinator (where the outbox and the operator's LISTEN are), in `conn`'s transaction."""
    await conn.fetch_one(
        "citus_status_outbox_queue",
        {"ids": list(ids), "old_statuses": list(old), "new_statuses": list(new)},
    )


async def citus_queue_returned_changes(conn: Connection, row: Row | dict[str, Any] | None) -> None:
    """The Kubernetes rows' changes a delegated function returned (`kube_ids`,
    `kube_old_statuses`, `kube_new_statuses`), queued by citus_status_outbox_queue."""
    if row is not None and row["kube_ids"]:
        await citus_status_outbox_queue(
            conn, row["kube_ids"], row["kube_old_statuses"], row["kube_new_statuses"]
        )
