"""The operator's own HTTP endpoints on --metrics-port: /healthz relays kopf's liveness probe and
/metrics shows the operator's figures (mirrors, status patches, outbox lag)."""

from __future__ import annotations

import socket

import aiohttp
import pytest

from tests.operator.conftest import StartOperator
from tests.operator.support import Kube, notification, phase
from tests.support import eventually

pytestmark = pytest.mark.kubernetes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_the_metrics_port_serves_liveness_and_the_operators_metrics(
    kube: Kube, namespace: str, start_operator: StartOperator
) -> None:
    port = _free_port()
    await start_operator(metrics_port=port)
    await kube.create(notification(namespace, "counted"))

    async def pending() -> bool:
        return phase(await kube.get("Notification", namespace, "counted")) == "Pending"

    await eventually(pending, timeout=15)

    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/healthz") as response:
            assert response.status == 200
            assert isinstance(await response.json(), dict)
        async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
            assert response.status == 200
            text = await response.text()
    assert 'notify_queue_operator_mirrors_total{kind="notification",outcome="accepted"}' in text
    assert 'notify_queue_operator_status_patches_total{outcome="patched"}' in text
    assert "notify_queue_operator_status_outbox_lag_seconds" in text
    assert 'notify_queue_operator_scale_changes_total{direction="up"}' in text
    # The one object of the namespace, Pending: remembered by kopf in memory (operator/storage.py).
    assert 'notify_queue_operator_objects_remembered{store="kopf"} 1.0' in text
    assert 'notify_queue_operator_objects_remembered{store="diffbase"} 1.0' in text
