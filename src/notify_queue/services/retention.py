"""Keeping the delivery log to its retention: partitions ahead of time, old ones dropped whole."""

from __future__ import annotations

import logging

from notify_queue.repositories.delivery_log import DeliveryLogRepository, Dropped

log = logging.getLogger(__name__)

# Partitions exist this many days ahead, so a worker that stops running housekeeping for less
# than that never leaves a day without one (the move trigger makes one if it must, too).
DAYS_AHEAD = 7


class DeliveryLogKeeper:
    def __init__(self, repository: DeliveryLogRepository, *, retention_days: float) -> None:
        self._repository = repository
        self._retention_seconds = retention_days * 86_400

    async def maintain(self) -> list[Dropped]:
        """Create the coming days' partitions, build the index parts a migration left to the
        workers (0009); drop the partitions past the retention (0 keeps all)."""
        created = await self._repository.partitions_prepare(days_ahead=DAYS_AHEAD)
        if created:
            log.info("delivery log: created %d partitions ahead", created)
        for partition in await self._repository.partitions_index():
            log.info("delivery log: %s has its part of the log's indexes", partition)
        if self._retention_seconds <= 0:
            log.debug("delivery log: retention off, nothing dropped")
            return []
        dropped = await self._repository.partitions_drop_expired(
            retention_seconds=self._retention_seconds
        )
        for d in dropped:
            log.info(
                "delivery log: dropped %s (%d notifications past the retention)",
                d.partition,
                d.rows,
            )
        forgotten = await self._repository.digests_forget(retention_seconds=self._retention_seconds)
        if forgotten:
            log.info("digests: removed %d closed before the retention", forgotten)
        log.debug("delivery log: retention run done, %d partitions dropped", len(dropped))
        return dropped
