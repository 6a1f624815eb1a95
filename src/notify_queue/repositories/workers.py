"""Worker heartbeats: which lanes (channel, priority) live workers serve (migration 0049)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from notify_queue.models import Channel, Priority
from notify_queue.repositories.db import Database

# Lanes (channel, priority) that workers serve, or that none does.
Lanes = frozenset[tuple[Channel, Priority]]


def lane_keys(lanes: Lanes) -> list[str]:
    """Lanes as the statements match them (`channel:rank`: the queue stores the rank)."""
    return [f"{channel.value}:{priority.rank}" for channel, priority in sorted(lanes)]


class WorkerRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def worker_heartbeat(
        self, *, id: uuid.UUID, channels: Sequence[Channel], priorities: Sequence[Priority]
    ) -> None:
        await self._db.execute(
            "worker_heartbeat",
            {
                "id": id,
                "channels": [c.value for c in channels],
                "priorities": [p.value for p in priorities],
            },
        )

    async def worker_forget(self, *, id: uuid.UUID) -> None:
        await self._db.execute("worker_forget", {"id": id})

    async def worker_lanes_served(self, *, live_seconds: float) -> Lanes:
        rows = await self._db.fetch_all("worker_lanes_served", {"live_seconds": live_seconds})
        return frozenset((Channel(r["channel"]), Priority(r["priority"])) for r in rows)
