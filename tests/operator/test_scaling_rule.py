"""The worker scaling rule (`services.scaling`) on its own: the annotations it reads, the replica
count it wants, up at once and down only after the delay. Pure functions, no cluster."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from notify_queue.errors import ValidationFailed
from notify_queue.models import Channel, Priority
from notify_queue.services.scaling import (
    PoolConfig,
    autoscaler_targets,
    decide_scale,
    desired_replicas,
    pool_config_from_annotations,
    pool_depth,
)

NOW = datetime(2026, 9, 24, 12, 0, tzinfo=UTC)

configs = st.builds(
    lambda lo, span, target, delay: PoolConfig(
        min_replicas=lo,
        max_replicas=max(lo, 1) + span,
        target_depth_per_replica=target,
        scale_down_delay_seconds=delay,
    ),
    st.integers(0, 5),
    st.integers(0, 20),
    st.integers(1, 500),
    st.floats(0, 600),
)


def test_the_annotations_have_the_contract_defaults() -> None:
    assert pool_config_from_annotations({}) == PoolConfig(
        priorities=frozenset(Priority),
        min_replicas=1,
        max_replicas=10,
        target_depth_per_replica=100,
        scale_down_delay_seconds=300.0,
    )


def test_the_annotations_are_read_with_seconds_or_durations() -> None:
    config = pool_config_from_annotations(
        {
            "notifyqueue.io/priorities": "high, normal",
            "notifyqueue.io/min-replicas": "2",
            "notifyqueue.io/max-replicas": "8",
            "notifyqueue.io/target-depth-per-replica": "50",
            "notifyqueue.io/scale-down-delay": "5m",
        }
    )
    assert config == PoolConfig(frozenset({Priority.HIGH, Priority.NORMAL}), 2, 8, 50, 300.0)
    assert (
        pool_config_from_annotations(
            {"notifyqueue.io/scale-down-delay": "90"}
        ).scale_down_delay_seconds
        == 90
    )


def test_every_bad_annotation_is_named() -> None:
    with pytest.raises(ValidationFailed) as caught:
        pool_config_from_annotations(
            {
                "notifyqueue.io/priorities": "URGENT",
                "notifyqueue.io/max-replicas": "0",
                "notifyqueue.io/target-depth-per-replica": "many",
                "notifyqueue.io/scale-down-delay": "soon",
            }
        )
    assert {e.field for e in caught.value.errors} == {
        "notifyqueue.io/priorities",
        "notifyqueue.io/max-replicas",
        "notifyqueue.io/target-depth-per-replica",
        "notifyqueue.io/scale-down-delay",
    }


def test_min_above_max_is_refused() -> None:
    with pytest.raises(ValidationFailed, match="must not exceed max-replicas"):
        pool_config_from_annotations(
            {"notifyqueue.io/min-replicas": "5", "notifyqueue.io/max-replicas": "3"}
        )


def test_the_depth_of_a_pool_counts_only_its_lanes() -> None:
    depths = {
        (Priority.HIGH, Channel.EMAIL): 7,
        (Priority.HIGH, Channel.SMS): 3,
        (Priority.NORMAL, Channel.EMAIL): 100,
        (Priority.LOW, Channel.PUSH): 1000,
    }
    assert pool_depth(depths, PoolConfig(priorities=frozenset({Priority.HIGH}))) == 10
    assert pool_depth(depths, PoolConfig()) == 1110
    email_only = PoolConfig(channels=frozenset({Channel.EMAIL}))
    assert pool_depth(depths, email_only) == 107
    high_sms = PoolConfig(priorities=frozenset({Priority.HIGH}), channels=frozenset({Channel.SMS}))
    assert pool_depth(depths, high_sms) == 3


def test_the_channels_annotation_names_the_channels_a_pool_drains() -> None:
    config = pool_config_from_annotations({"notifyqueue.io/channels": "Email, sms"})
    assert config.channels == frozenset({Channel.EMAIL, Channel.SMS})
    assert pool_config_from_annotations({}).channels == frozenset(Channel)
    with pytest.raises(ValidationFailed, match=r"notifyqueue\.io/channels"):
        pool_config_from_annotations({"notifyqueue.io/channels": "email,fax"})


def _ref(owner: str, namespace: str, owner_name: str, **target: str) -> dict[str, object]:
    return {
        "kind": owner,
        "metadata": {"namespace": namespace, "name": owner_name},
        "spec": {"scaleTargetRef": target},
    }


def test_deployments_targeted_by_an_hpa_or_a_scaled_object_are_found() -> None:
    hpas = [
        _ref(
            "HorizontalPodAutoscaler",
            "a",
            "web",
            apiVersion="apps/v1",
            kind="Deployment",
            name="bulk",
        ),
        # KEDA's own HPA for the ScaledObject below: the ScaledObject is what gets named.
        _ref(
            "HorizontalPodAutoscaler",
            "a",
            "keda-hpa-urgent",
            apiVersion="apps/v1",
            kind="Deployment",
            name="urgent",
        ),
        _ref(
            "HorizontalPodAutoscaler",
            "a",
            "sts",
            apiVersion="apps/v1",
            kind="StatefulSet",
            name="db",
        ),
    ]
    scaled_objects = [_ref("ScaledObject", "a", "urgent", name="urgent")]  # kind defaults
    assert autoscaler_targets(hpas, scaled_objects) == {
        ("a", "bulk"): "HorizontalPodAutoscaler/web",
        ("a", "urgent"): "ScaledObject/urgent",
    }
    assert autoscaler_targets([], []) == {}


@given(depth=st.integers(0, 100_000), config=configs)
def test_the_desired_count_is_the_clamped_ceiling_of_depth_over_target(
    depth: int, config: PoolConfig
) -> None:
    desired = desired_replicas(depth, config)
    assert config.min_replicas <= desired <= config.max_replicas
    assert desired == min(
        max(math.ceil(depth / config.target_depth_per_replica), config.min_replicas),
        config.max_replicas,
    )


@given(
    current=st.integers(0, 30),
    depth=st.integers(0, 10_000),
    config=configs,
    waited=st.one_of(st.none(), st.floats(0, 1200)),
)
def test_up_is_at_once_and_down_only_after_the_delay(
    current: int, depth: int, config: PoolConfig, waited: float | None
) -> None:
    since = None if waited is None else NOW - timedelta(seconds=waited)
    waited = None if since is None else (NOW - since).total_seconds()  # as timedelta rounded it
    decision = decide_scale(
        current=current, depth=depth, config=config, lower_wanted_since=since, now=NOW
    )
    desired = desired_replicas(depth, config)
    if desired >= current:
        assert decision.replicas == desired and decision.lower_wanted_since is None
    elif waited is not None and waited >= config.scale_down_delay_seconds:
        assert decision.replicas == desired and decision.lower_wanted_since is None
    elif waited is None and config.scale_down_delay_seconds == 0:
        assert decision.replicas == desired
    else:
        assert decision.replicas == current  # still waiting
        assert decision.lower_wanted_since == (since or NOW)


def test_a_scale_down_waits_the_delay_from_when_it_was_first_wanted() -> None:
    config = PoolConfig(
        min_replicas=1, max_replicas=10, target_depth_per_replica=10, scale_down_delay_seconds=60
    )
    first = decide_scale(current=5, depth=0, config=config, lower_wanted_since=None, now=NOW)
    assert (first.replicas, first.lower_wanted_since) == (5, NOW)
    later = decide_scale(
        current=5, depth=12, config=config, lower_wanted_since=NOW, now=NOW + timedelta(seconds=30)
    )
    assert (later.replicas, later.lower_wanted_since) == (5, NOW)  # 2 wanted: still lower
    done = decide_scale(
        current=5, depth=12, config=config, lower_wanted_since=NOW, now=NOW + timedelta(seconds=60)
    )
    assert (done.replicas, done.lower_wanted_since) == (2, None)


def test_a_burst_during_the_delay_calls_the_scale_down_off() -> None:
    config = PoolConfig(target_depth_per_replica=10, scale_down_delay_seconds=60)
    decision = decide_scale(
        current=5, depth=80, config=config, lower_wanted_since=NOW - timedelta(seconds=59), now=NOW
    )
    assert (decision.replicas, decision.lower_wanted_since) == (8, None)


def test_a_wanted_since_in_the_future_starts_the_delay_now() -> None:
    config = PoolConfig(scale_down_delay_seconds=60)
    decision = decide_scale(
        current=5, depth=0, config=config, lower_wanted_since=NOW + timedelta(hours=1), now=NOW
    )
    assert (decision.replicas, decision.lower_wanted_since) == (5, NOW)
