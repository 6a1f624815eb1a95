"""Worker scaling: every `scale_interval` seconds, size each worker pool to its lanes' depth.

One round reads the lane depths once (the claim index only) and exports them as metrics (per
priority and channel: depth and oldest due age, for an HPA or KEDA to scale on instead), lists the
Deployments labelled `notifyqueue.io/worker-pool`, applies the rule of `services.scaling` to
each, and sets the replica count through the scale subresource when it changes (with an Event).
It never writes to the Deployment itself (it may not: docs/security.md), so the moment since
which fewer replicas are wanted is kept in memory: a restarted operator starts the scale-down
delay afresh, scaling down later rather than sooner.

A pool that an HorizontalPodAutoscaler or a KEDA ScaledObject targets is left alone: its
replicas are the autoscaler's (an Event and a log line say so once, a gauge counts such pools).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from notify_queue.errors import NotifyQueueError, ValidationFailed
from notify_queue.models import Channel, Priority
from notify_queue.operator import metrics
from notify_queue.operator.kubeapi import KubeApi, WorkerPool
from notify_queue.operator.waiting import pause
from notify_queue.repositories.kube import KubeRepository, LaneDepth
from notify_queue.services import scaling

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
        # Pools (uid) an autoscaler owns -> which one, as last reported.
        self._owners: dict[str, str] = {}
        # Pools (uid) -> since when fewer replicas are wanted (the scale-down delay runs).
        self._lower_wanted_since: dict[str, datetime] = {}

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.scale_once()
            except NotifyQueueError as exc:
                log.warning("scaling round skipped: %s", exc)
            await pause(stop, self._interval_seconds)

    async def scale_once(self, *, now: datetime | None = None) -> None:
        depths = await self._repository.lane_depths()
        for priority in Priority:
            for channel in Channel:
                lane = depths.get((priority, channel), LaneDepth(0, 0.0))
                metrics.LANE_DEPTH.labels(priority.value, channel.value).set(lane.depth)
                metrics.LANE_OLDEST_DUE_AGE.labels(priority.value, channel.value).set(
                    lane.oldest_due_age_seconds
                )
        pools = await self._kube.worker_pools(namespace=self._namespace, label=scaling.POOL_LABEL)
        if not pools:
            self._report_owners({})
            return
        hpas, scaled_objects = await self._kube.autoscalers(namespace=self._namespace)
        owners = scaling.autoscaler_targets(hpas, scaled_objects)
        counts = {(p, c): lane.depth for (p, c), lane in depths.items()}
        managed: dict[str, str] = {}
        for pool in pools:
            owner = owners.get((pool.namespace, pool.name))
            if owner is not None:
                managed[pool.uid] = owner
                self._leave_alone(pool, owner)
                continue
            await self._scale_pool(pool, counts, now or datetime.now(UTC))
        self._report_owners(managed)
        seen = {pool.uid for pool in pools}
        for uid in self._lower_wanted_since.keys() - seen:
            del self._lower_wanted_since[uid]  # the Deployment is gone
        metrics.WORKER_POOLS.labels("operator").set(len(pools) - len(managed))
        metrics.WORKER_POOLS.labels("autoscaler").set(len(managed))

    def _leave_alone(self, pool: WorkerPool, owner: str) -> None:
        """Say once (per owner) that the pool's replicas belong to an autoscaler."""
        if self._owners.get(pool.uid) == owner:
            return
        message = (
            f"replicas left to {owner}: the operator does not scale a Deployment that an "
            "HorizontalPodAutoscaler or KEDA ScaledObject targets"
        )
        log.info("worker pool %s/%s: %s", pool.namespace, pool.name, message)
        self._kube.event_soon(
            involved=_involved(pool), type="Normal", reason="ScaledExternally", message=message
        )

    def _report_owners(self, managed: dict[str, str]) -> None:
        for uid in self._owners.keys() - managed.keys():
            log.info("worker pool %s is scaled by the operator again", uid)
        self._owners = managed

    async def _scale_pool(
        self, pool: WorkerPool, depths: dict[scaling.Lane, int], now: datetime
    ) -> None:
        involved = _involved(pool)
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
        since = self._lower_wanted_since.get(pool.uid)
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
            message = (
                f"scaled {direction} from {pool.replicas} to {decision.replicas}: {depth} due in "
                f"{scaling.lanes_label(config)} (target {config.target_depth_per_replica} per "
                f"replica, min {config.min_replicas}, max {config.max_replicas})"
            )
            log.info("worker pool %s/%s %s", pool.namespace, pool.name, message)
            self._kube.event_soon(
                involved=involved, type="Normal", reason="Scaled", message=message
            )
        if decision.lower_wanted_since is None:
            self._lower_wanted_since.pop(pool.uid, None)
        else:
            self._lower_wanted_since[pool.uid] = decision.lower_wanted_since


def _involved(pool: WorkerPool) -> dict[str, str]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "namespace": pool.namespace,
        "name": pool.name,
        "uid": pool.uid,
    }
