"""Delivery policies (mirrored from NotificationPolicy resources)."""

from __future__ import annotations

from typing import TypedDict

from notify_queue import jsontext
from notify_queue.models import ChannelRateLimit, Failover, Policy
from notify_queue.repositories.db import Database


class PolicyUpsert(TypedDict):
    """`policy_upsert`: a policy's fields (None: the worker's default), and its readiness."""

    name: str
    rate_limit: int | None
    rate_window_seconds: float | None
    channel_rate_limits: str | None
    max_attempts: int | None
    backoff_base_seconds: float | None
    backoff_max_seconds: float | None
    webhook_url: str | None
    webhook_secrets: list[str]
    ttl_seconds_after_finished: int | None
    ready: bool
    failover: str | None
    providers: list[str] | None


class PolicyRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def policy_upsert(self, *, policy: Policy, ready: bool = True) -> bool:
        """Store the policy; `ready` False holds its notifications. True if readiness changed."""
        params: PolicyUpsert = {
            "name": policy.name,
            "rate_limit": policy.rate_limit,
            "rate_window_seconds": policy.rate_window_seconds,
            # {"sms": {"maxPerWindow": n, "windowSeconds": s}}: the claim reads its row's channel.
            "channel_rate_limits": jsontext.dumps_text(
                {
                    channel: {"maxPerWindow": c.max_per_window, "windowSeconds": c.window_seconds}
                    for channel, c in policy.channel_rate_limits.items()
                }
            )
            if policy.channel_rate_limits
            else None,
            "max_attempts": policy.max_attempts,
            "backoff_base_seconds": policy.backoff_base_seconds,
            "backoff_max_seconds": policy.backoff_max_seconds,
            "webhook_url": policy.webhook_url,
            "webhook_secrets": list(policy.webhook_secrets),
            "ttl_seconds_after_finished": policy.ttl_seconds_after_finished,
            "ready": ready,
            "failover": policy.failover.value if policy.failover else None,
            "providers": list(policy.providers) if policy.providers is not None else None,
        }
        row = await self._db.fetch_one("policy_upsert", params)
        return bool(row and row["ready_changed"])

    async def policy_release_held(self, *, name: str) -> int:
        """The policy is Ready again: its held notifications are due now. Returns how many."""
        row = await self._db.fetch_one("policy_release_held", {"name": name})
        return int(row["released"]) if row else 0

    async def policy_refresh_statuses(self, *, namespace: str, name: str) -> int:
        """Queue status writes for the PENDING Notification objects naming the policy `name`."""
        row = await self._db.fetch_one(
            "policy_refresh_statuses", {"namespace": namespace, "name": name}
        )
        return int(row["queued"]) if row else 0

    async def policy_delete(self, *, name: str) -> None:
        await self._db.execute("policy_delete", {"name": name})

    async def policy_get(self, *, name: str) -> Policy | None:
        row = await self._db.fetch_one("policy_get", {"name": name})
        if row is None:
            return None
        return Policy(
            name=row["name"],
            rate_limit=row["rate_limit"],
            rate_window_seconds=row["rate_window_seconds"],
            channel_rate_limits={
                channel: ChannelRateLimit(int(c["maxPerWindow"]), float(c["windowSeconds"]))
                for channel, c in (row["channel_rate_limits"] or {}).items()
            },
            max_attempts=row["max_attempts"],
            backoff_base_seconds=row["backoff_base_seconds"],
            backoff_max_seconds=row["backoff_max_seconds"],
            webhook_url=row["webhook_url"],
            webhook_secrets=tuple(row["webhook_secrets"]),
            ttl_seconds_after_finished=row["ttl_seconds_after_finished"],
            failover=Failover(row["failover"]) if row["failover"] else None,
            providers=tuple(row["providers"]) if row["providers"] is not None else None,
        )
