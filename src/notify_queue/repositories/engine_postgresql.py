"""The plain PostgreSQL driver: one statement over the whole queue per step (sql/*.sql)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from notify_queue.models import Completion, Engine
from notify_queue.repositories import driver
from notify_queue.repositories.db import Connection, Database, Row


class PostgresDriver:
    engine = Engine.POSTGRESQL

    async def rate_windows_prune(self, db: Database, params: driver.RateWindowsPrune) -> int:
        return await db.execute("prune_rate_windows", params)

    async def claims_release(self, db: Database, params: driver.ClaimsRelease) -> int:
        row = await db.fetch_one("release_claims", params)
        return int(row["released"]) if row else 0

    async def deliveries_complete(
        self, db: Database, results: Sequence[Completion], params_of: driver.ParamsOf
    ) -> driver.Recorded:
        # One statement in autocommit: the function carries the drain's plan settings
        # (functions/nq_complete_deliveries.sql), so no transaction is opened for them.
        async with db.connection() as conn:
            return await self.deliveries_record(conn, params_of(results), None)

    async def deliveries_record(
        self, conn: Connection, params: driver.DeliveriesComplete, bucket: int | None
    ) -> driver.Recorded:
        # Prepared at its first run on this connection; the function's own statement is planned
        # once per connection by PL/pgSQL, under the function's settings.
        row = await conn.fetch_one("complete_deliveries", params, prepare=True)
        if row is None:
            return set(), False
        return set(row["accepted"]), bool(row["events_possible"])

    async def leases_recover_expired(
        self, db: Database, params: driver.HousekeepingBatch
    ) -> tuple[int, int]:
        row = await db.fetch_one("recover_expired_leases", params)
        return (int(row["recovered"]), int(row["dead_lettered"])) if row else (0, 0)

    async def notifications_expire_overdue(
        self, db: Database, params: driver.HousekeepingBatch
    ) -> int:
        row = await db.fetch_one("expire_overdue", params)
        return int(row["expired"]) if row else 0

    async def webhook_events_claim(self, db: Database, params: driver.WebhookClaim) -> list[Row]:
        rows = await db.fetch_all("webhook_claim_due", params)
        return [r for r in rows if r["id"] is not None]

    async def notification_cancel(
        self, conn: Connection, params: driver.NotificationCancel
    ) -> bool:
        if await conn.fetch_one("notification_cancel", params) is not None:
            return True
        # A digest's item (docs/digests.md): its digest locked first, then, only while it is
        # open, the item leaves it in a statement of its own.
        digest = await conn.fetch_one("digest_cancel_lock", {"id": params["id"]})
        if digest is None or digest["state"] != "open":
            return False
        left = await conn.fetch_one(
            "digest_item_cancel",
            {**params, "bucket": digest["bucket"], "digest_id": digest["id"]},
        )
        return left is not None and left["id"] is not None

    async def notification_retry(self, conn: Connection, id: uuid.UUID) -> bool:
        retried = await conn.fetch_one("notification_retry", {"id": id})
        return retried is not None and retried["id"] is not None

    async def notifications_retry_batch(
        self, db: Database, *, status: str, limit: int
    ) -> tuple[int, int]:
        row = await db.fetch_one("notification_retry_batch", {"status": status, "limit": limit})
        assert row is not None
        return int(row["retried"]), max(int(row["remaining"]), 0)

    async def escalation_acknowledge(
        self, db: Database, params: driver.EscalationAcknowledge
    ) -> bool:
        async with db.transaction() as conn:
            locked = await conn.fetch_one("escalation_acknowledge_lock", params)
            if locked is None:
                return False
            if locked["acknowledged_at"] is None:
                await conn.execute(
                    "escalation_acknowledge_mark",
                    {"bucket": locked["bucket"], "id": params["id"], "by": params["by"]},
                )
            await conn.fetch_one("notification_log_ready")
            await conn.fetch_all(
                "escalation_steps_stop",
                {
                    "ids": locked["step_ids"],
                    "bucket": locked["bucket"],
                    "default_webhook_url": params["default_webhook_url"],
                },
            )
            await conn.fetch_one("escalation_note_objects", {"ids": locked["step_ids"]})
        return True

    async def kube_link_save(self, db: Database, params: driver.KubeLinkSave) -> None:
        # Twice at most: a row moved to the log while the first run waited for its lock is found
        # by the second (see kube_link_save).
        for _ in range(2):
            row = await db.fetch_one("kube_link_save", params)
            if row is not None and row["queued"]:
                return

    async def status_outbox_take(
        self, conn: Connection, params: driver.StatusOutboxTake
    ) -> list[Row]:
        return await conn.fetch_all("status_outbox_take", params)

    async def kube_finished_take_due(
        self, db: Database, params: driver.StatusOutboxTake
    ) -> list[Row]:
        return await db.fetch_all("kube_finished_take_due", params)

    async def delivery_log_forget_keys(
        self, conn: Connection, params: driver.LogKeysChunk
    ) -> Row | None:
        return await conn.fetch_one("delivery_log_forget_keys", params)

    async def delivery_log_detach(self, conn: Connection, *, partition: str) -> None:
        await conn.execute_on("delivery_log_detach", {"partition": partition})
