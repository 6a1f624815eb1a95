"""How many workers a pool should run: the scaling rule for Deployments labelled
`notifyqueue.io/worker-pool` (docs/operator.md, "Worker scaling"), as pure functions.

desired = clamp(ceil(depth / target-depth-per-replica), min-replicas, max-replicas), where depth
is the number of notifications PENDING, due now and not expired in the lanes the pool drains:
its priorities by its channels (`notifyqueue.io/priorities`, `notifyqueue.io/channels`), so a
pool of email workers is not scaled on an SMS backlog it cannot touch. Up at once (a
backlog of one-time codes cannot wait), down only once the lower number has been wanted for the
whole scale-down delay (a dip between two bursts should not cost a restart of every pod). The
moment since which a lower number is wanted lives with the Deployment (an annotation), so the
rule is a function of what the Deployment says plus the depth, and survives operator restarts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from notify_queue.errors import FieldError, ValidationFailed
from notify_queue.models import Channel, Priority
from notify_queue.services.kube import parse_duration_seconds

POOL_LABEL = "notifyqueue.io/worker-pool"
PRIORITIES = "notifyqueue.io/priorities"
CHANNELS = "notifyqueue.io/channels"
MIN_REPLICAS = "notifyqueue.io/min-replicas"
MAX_REPLICAS = "notifyqueue.io/max-replicas"
TARGET_DEPTH = "notifyqueue.io/target-depth-per-replica"
SCALE_DOWN_DELAY = "notifyqueue.io/scale-down-delay"


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """A pool's scaling settings, from its Deployment's annotations (defaults in brackets)."""

    # The lanes the pool serves, priorities by channels [all of each]; their depths add up.
    priorities: frozenset[Priority] = frozenset(Priority)
    min_replicas: int = 1  # [1]: one worker keeps latency low when the queue is quiet
    max_replicas: int = 10  # [10]: a bound on what a burst can cost
    target_depth_per_replica: int = 100  # [100]: due notifications one worker should face
    scale_down_delay_seconds: float = 300.0  # [300 s]: how long a lower count must be wanted
    # [all]: the channels its workers take (--channels), with `priorities` the lanes it drains.
    channels: frozenset[Channel] = frozenset(Channel)


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    replicas: int
    # Since when a lower count has been wanted while we wait out the delay; None: not waiting.
    lower_wanted_since: datetime | None

    def changes(self, current: int) -> bool:
        return self.replicas != current


def pool_config_from_annotations(annotations: Mapping[str, str]) -> PoolConfig:
    """Read the pool's annotations; ValidationFailed names every bad one."""
    errors: list[FieldError] = []
    defaults = PoolConfig()

    def integer(key: str, default: int, minimum: int) -> int:
        raw = annotations.get(key)
        if raw is None or raw.strip() == "":
            return default
        try:
            value = int(raw.strip())
        except ValueError:
            errors.append(FieldError(key, f"must be a whole number, not {raw!r}"))
            return default
        if value < minimum:
            errors.append(FieldError(key, f"must be at least {minimum}"))
            return default
        return value

    priorities = defaults.priorities
    if (raw := annotations.get(PRIORITIES)) is not None and raw.strip():
        try:
            priorities = frozenset(Priority(p.strip().upper()) for p in raw.split(",") if p.strip())
        except ValueError:
            errors.append(FieldError(PRIORITIES, f"must list HIGH, NORMAL or LOW, not {raw!r}"))
    channels = defaults.channels
    if (raw := annotations.get(CHANNELS)) is not None and raw.strip():
        try:
            channels = frozenset(Channel(c.strip().lower()) for c in raw.split(",") if c.strip())
        except ValueError:
            *others, last = Channel
            known = f"{', '.join(others)} or {last}"
            errors.append(FieldError(CHANNELS, f"must list {known}, not {raw!r}"))
    delay = defaults.scale_down_delay_seconds
    if (raw := annotations.get(SCALE_DOWN_DELAY)) is not None and raw.strip():
        try:
            delay = _seconds(raw)
        except ValueError:
            errors.append(
                FieldError(
                    SCALE_DOWN_DELAY, f"must be seconds (300) or a duration (5m), not {raw!r}"
                )
            )
    config = PoolConfig(
        priorities=priorities,
        channels=channels,
        min_replicas=integer(MIN_REPLICAS, defaults.min_replicas, 0),
        max_replicas=integer(MAX_REPLICAS, defaults.max_replicas, 1),
        target_depth_per_replica=integer(TARGET_DEPTH, defaults.target_depth_per_replica, 1),
        scale_down_delay_seconds=delay,
    )
    if config.min_replicas > config.max_replicas:
        errors.append(FieldError(MIN_REPLICAS, "must not exceed max-replicas"))
    if errors:
        raise ValidationFailed(errors)
    return config


def _seconds(text: str) -> float:
    """Plain seconds (`300`, `90.5`) or a duration (`5m`, `1h30m`)."""
    try:
        seconds = float(text)
    except ValueError:
        return parse_duration_seconds(text)
    if not 0 <= seconds < float("inf"):
        raise ValueError("must not be negative")
    return seconds


Lane = tuple[Priority, Channel]


def pool_depth(depths: Mapping[Lane, int], config: PoolConfig) -> int:
    """The depth of the lanes the pool drains (depths per priority and channel)."""
    return sum(depths.get((p, c), 0) for p in config.priorities for c in config.channels)


def lanes_label(config: PoolConfig) -> str:
    """`HIGH,NORMAL for email,sms` for messages: what the pool drains."""
    priorities = ",".join(p.value for p in Priority if p in config.priorities)
    channels = ",".join(c.value for c in Channel if c in config.channels)
    return f"{priorities} for {channels}"


def desired_replicas(depth: int, config: PoolConfig) -> int:
    wanted = math.ceil(max(depth, 0) / config.target_depth_per_replica)
    return min(max(wanted, config.min_replicas), config.max_replicas)


def decide_scale(
    *,
    current: int,
    depth: int,
    config: PoolConfig,
    lower_wanted_since: datetime | None,
    now: datetime,
) -> ScaleDecision:
    """The replica count to set now, and the lower-wanted-since moment to remember."""
    desired = desired_replicas(depth, config)
    if desired >= current:
        # Up at once; equal: nothing to do. Either way a pending scale-down is called off.
        return ScaleDecision(desired, None)
    since = (
        lower_wanted_since if lower_wanted_since is not None and lower_wanted_since <= now else now
    )
    if (now - since).total_seconds() >= config.scale_down_delay_seconds:
        return ScaleDecision(desired, None)
    return ScaleDecision(current, since)


# Who owns a Deployment's replica count when it is not the operator.
HPA = "HorizontalPodAutoscaler"
SCALED_OBJECT = "ScaledObject"


def autoscaler_targets(
    hpas: Sequence[Mapping[str, Any]], scaled_objects: Sequence[Mapping[str, Any]]
) -> dict[tuple[str, str], str]:
    """(namespace, Deployment name) -> `Kind/name` of the HPA or KEDA ScaledObject scaling it.

    The operator leaves such a Deployment's replicas alone: two controllers writing one number
    fight, and the autoscaler is what the user chose. KEDA makes an HPA for each ScaledObject;
    the ScaledObject is named first, as it is what the user wrote (and it exists before KEDA has
    made its HPA). A ScaledObject's target defaults to a Deployment (apps/v1), as in KEDA.
    """
    targets: dict[tuple[str, str], str] = {}
    for kind, items in ((HPA, hpas), (SCALED_OBJECT, scaled_objects)):
        for item in items:
            meta = item.get("metadata") or {}
            ref = (item.get("spec") or {}).get("scaleTargetRef") or {}
            if ref.get("kind", "Deployment") != "Deployment" or not ref.get("name"):
                continue
            if str(ref.get("apiVersion", "apps/v1")).split("/")[0] != "apps":
                continue
            key = (str(meta.get("namespace")), str(ref["name"]))
            if kind == SCALED_OBJECT or key not in targets:
                targets[key] = f"{kind}/{meta.get('name')}"
    return targets
