"""Fixtures of the shipping tests: the chart, helm and kubectl, and the local control plane.

The control plane is `notify_queue.devcluster.LocalControlPlane` (etcd + kube-apiserver, no
kubelet), started once per session with the project's CRDs installed. Tests that need it, or
helm and kubectl, are skipped with the command to run when the binaries are not built.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from notify_queue.devcluster import ControlPlaneUnavailable, LocalControlPlane, find_bin_dir
from tests.shipping.support import ROOT, Tools
from tests.support import missing_component


@pytest.fixture(scope="session")
def tools() -> Tools:
    """helm and kubectl from scripts/build-k8s-binaries.sh; skips when they are not built."""
    try:
        bin_dir = find_bin_dir()
    except ControlPlaneUnavailable as exc:
        missing_component("kubernetes binaries", str(exc))
    if not os.access(bin_dir / "helm", os.X_OK):
        missing_component("helm", f"not in {bin_dir}; run scripts/build-k8s-binaries.sh")
    return Tools(bin_dir)


@pytest.fixture(scope="session")
def cluster(tools: Tools, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalControlPlane]:
    plane = LocalControlPlane(tmp_path_factory.mktemp("shipping-k8s"), bin_dir=tools.bin_dir)
    plane.start()
    try:
        plane.install_crds(ROOT / "crds")
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def kubeconfig(cluster: LocalControlPlane) -> Path:
    return cluster.kubeconfig
