"""Fixtures of the operator tests.

The local control plane is the session's `control_plane` (tests/conftest.py). Each test
gets its own namespace (nothing deletes namespaces here: there is no controller-manager) and its
own database (`database_url`), and starts the operator (in a thread) and workers (in the test's
loop) as it needs them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from notify_queue.devcluster import LocalControlPlane
from tests.operator.support import Kube, OperatorThread, settings_for


@pytest.fixture
async def kube(control_plane: LocalControlPlane) -> AsyncIterator[Kube]:
    client = Kube(control_plane)
    yield client
    await client.close()


@pytest.fixture
async def namespace(kube: Kube) -> str:
    return await kube.namespace_create()


StartOperator = Callable[..., Awaitable[OperatorThread]]


@pytest.fixture
async def start_operator(
    control_plane: LocalControlPlane, database_url: str, namespace: str
) -> AsyncIterator[StartOperator]:
    """Start an operator for this test's namespace and database; all are stopped at the end."""
    started: list[OperatorThread] = []

    async def start(**overrides: Any) -> OperatorThread:
        settings = settings_for(database_url, namespace, **overrides)
        operator = OperatorThread(settings, control_plane.kubeconfig)
        started.append(operator)
        return await operator.start()

    yield start
    for operator in started:
        await operator.stop()


@pytest.fixture
async def operator(start_operator: StartOperator) -> OperatorThread:
    return await start_operator()
