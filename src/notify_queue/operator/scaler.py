"""Worker scaling: every `scale_interval` seconds, size each worker pool to its lanes' depth.

One round reads the lane depths once (the claim index only), lists the Deployments labelled
`notifyqueue.io/worker-pool`, applies the rule of `services.scaling` to each, sets the replica
count through the scale subresource when it changes (with an Event), and keeps the
"lower wanted since" moment in an annotation on the Deployment, so a restarted operator goes on
waiting out the scale-down delay where the previous one stopped.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from notify_queue.errors import NotifyQueueError, ValidationFailed
from notify_queue.models import Priority
from notify_queue.operator import metrics
from notify_queue.operator.kubeapi import KubeApi, WorkerPool
from notify_queue.operator.waiting import pause
from notify_queue.repositories.kube import KubeRepository
from notify_queue.services import scaling
from notify_queue.services.validation import parse_rfc3339

log = logging.getLogger(__name__)


class WorkerScaler:
    def __init__(
        self,
        repository: KubeRepository,
        kube: KubeApi,
        *,
        namespace: str | None,
        interval_seconds: float,
    ) -> None:
        self._repository = repository
        self._kube = kube
        self._namespace = namespace
        self._interval_seconds = interval_seconds
        # Pools whose bad annotations were reported already: one Event each, not one a round.
        self._reported: dict[str, str] = {}

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.scale_once()
            except NotifyQueueError as exc:
                log.warning("scaling round skipped: %s", exc)
            await pause(stop, self._interval_seconds)

    async def scale_once(self, *, now: datetime | None = None) -> None:
        pools = await self._kube.worker_pools(namespace=self._namespace, label=scaling.POOL_LABEL)
        if not pools:
            return
        depths = await self._repository.lane_depths()
        for pool in pools:
            await self._scale_pool(pool, depths, now or datetime.now(UTC))

    async def _scale_pool(
        self, pool: WorkerPool, depths: dict[Priority, int], now: datetime
    ) -> None:
        involved = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "namespace": pool.namespace,
            "name": pool.name,
            "uid": pool.uid,
        }
        try:
            config = scaling.pool_config_from_annotations(pool.annotations)
        except ValidationFailed as exc:
            if self._reported.get(pool.uid) != str(exc):
                self._reported[pool.uid] = str(exc)
                log.warning("worker pool %s/%s not scaled: %s", pool.namespace, pool.name, exc)
                self._kube.event_soon(
                    involved=involved,
                    type="Warning",
                    reason="InvalidScalingAnnotations",
                    message=str(exc),
                )
            return
        self._reported.pop(pool.uid, None)
        since = _parse_time(pool.annotations.get(scaling.LOWER_WANTED_SINCE))
        depth = scaling.pool_depth(depths, config)
        decision = scaling.decide_scale(
            current=pool.replicas, depth=depth, config=config, lower_wanted_since=since, now=now
        )
        if decision.changes(pool.replicas):
            await self._kube.deployment_scale(
                namespace=pool.namespace, name=pool.name, replicas=decision.replicas
            )
            direction = "up" if decision.replicas > pool.replicas else "down"
            metrics.SCALE_CHANGES.labels(direction).inc()
            lanes = ",".join(p.value for p in Priority if p in config.priorities)
            message = (
                f"scaled {direction} from {pool.replicas} to {decision.replicas}: {depth} due in "
                f"{lanes} (target {config.target_depth_per_replica} per replica, "
                f"min {config.min_replicas}, max {config.max_replicas})"
            )
            log.info("worker pool %s/%s %s", pool.namespace, pool.name, message)
            self._kube.event_soon(
                involved=involved, type="Normal", reason="Scaled", message=message
            )
        if decision.lower_wanted_since != since:
            value = (
                None
                if decision.lower_wanted_since is None
                else decision.lower_wanted_since.isoformat()
            )
            await self._kube.deployment_annotate(
                namespace=pool.namespace,
                name=pool.name,
                annotations={scaling.LOWER_WANTED_SINCE: value},
            )


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return parse_rfc3339(value)
    except ValueError:
        return None  # unreadable: start the delay afresh
