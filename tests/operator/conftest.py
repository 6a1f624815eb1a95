"""Fixtures of the operator tests.

One local control plane (etcd + kube-apiserver, `notify_queue.devcluster`) per session, with the
CRDs installed; it is skipped, with the command to run, when the binaries are not built. Each test
gets its own namespace (nothing deletes namespaces here: there is no controller-manager) and its
own database (`database_url`), and starts the operator (in a thread) and workers (in the test's
loop) as it needs them.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from notify_queue.devcluster import ControlPlaneUnavailable, LocalControlPlane, find_bin_dir
from tests.operator.support import Kube, OperatorThread, settings_for


@pytest.fixture(scope="session")
def control_plane() -> Iterator[LocalControlPlane]:
    try:
        bin_dir = find_bin_dir()
    except ControlPlaneUnavailable as exc:
        pytest.skip(f"{exc} (scripts/build-k8s-binaries.sh)")
    # A directory of our own rather than pytest's basetemp: pytest prunes old basetemps, and a
    # concurrent pytest run pruning this one would pull etcd's data from under it.
    directory = Path(tempfile.mkdtemp(prefix="notify-queue-k8s-"))
    cluster = LocalControlPlane(
        directory, bin_dir=bin_dir, users={"viewer": ["notify-queue-viewers"]}
    )
    try:
        cluster.start()
        cluster.install_crds()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)


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
