"""The end-to-end path on a kind cluster, for those who have Docker (off by default).

The same journey as tests/operator on the envtest-style control plane, but on a real kind
cluster: CRDs installed with kubectl, the real operator and a real worker against an embedded
PostgreSQL, `examples/01-notification.yaml` applied, and its `.status.phase` read back as Sent.
Run with `pip install pytest-kind` and `pytest -m kind tests/kind` on a machine with Docker;
pytest-kind downloads kind and creates (and deletes) the cluster.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from notify_queue.repositories.db import Database
from tests.operator.support import OperatorThread, running_worker, settings_for
from tests.support import eventually

pytest.importorskip("pytest_kind", reason="pytest-kind is not installed (pip install pytest-kind)")
pytestmark = [
    pytest.mark.kind,
    pytest.mark.skipif(shutil.which("docker") is None, reason="kind needs Docker"),
]

ROOT = Path(__file__).resolve().parents[2]


async def test_an_applied_example_notification_is_sent_on_a_kind_cluster(
    kind_cluster: Any, database_url: str, db: Database
) -> None:
    kind_cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
    kind_cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    settings = settings_for(database_url, "default")
    operator = await OperatorThread(settings, Path(kind_cluster.kubeconfig_path)).start()
    try:
        async with running_worker(settings, db):
            kind_cluster.kubectl(
                "apply", "-n", "default", "-f", str(ROOT / "examples/01-notification.yaml")
            )

            async def sent() -> bool:
                phase = await asyncio.to_thread(
                    kind_cluster.kubectl,
                    "get",
                    "notif",
                    "welcome",
                    "-n",
                    "default",
                    "-o",
                    "jsonpath={.status.phase}",
                )
                return str(phase).strip() == "Sent"

            await eventually(sent, timeout=60, interval=1.0, what="phase Sent")
    finally:
        await operator.stop()
