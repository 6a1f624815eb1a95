"""A test whose real component is missing skips for a developer and fails in CI.

`missing_component` is the one way a test gives up on an absent PgBouncer, Citus, Prometheus or
Kubernetes binary: a skip that names the component, or a failure under
NOTIFY_QUEUE_REQUIRE_COMPONENTS=1 (`make test`, which CI runs). Checked on a pytest process of
its own running a test that calls it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
from tests.support import missing_component


def test_needs_pgbouncer():
    missing_component("pgbouncer", "scripts/install-test-packages.sh installs it (apt)")
"""


def _run_probe(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    environment = {k: v for k, v in os.environ.items() if k != "NOTIFY_QUEUE_REQUIRE_COMPONENTS"}
    environment |= {"PYTHONPATH": str(ROOT), **env}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", str(probe)],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_missing_component_is_a_skip_that_names_it_by_default(tmp_path: Path) -> None:
    result = _run_probe(tmp_path)
    assert result.returncode == 0, result.stdout
    assert "1 skipped" in result.stdout
    assert "component missing: pgbouncer: scripts/install-test-packages.sh" in result.stdout


def test_a_missing_component_fails_when_every_component_is_required(tmp_path: Path) -> None:
    result = _run_probe(tmp_path, NOTIFY_QUEUE_REQUIRE_COMPONENTS="1")
    assert result.returncode == 1, result.stdout
    assert "1 failed" in result.stdout
    assert (
        "component missing: pgbouncer: scripts/install-test-packages.sh installs it (apt) "
        "(NOTIFY_QUEUE_REQUIRE_COMPONENTS=1: every component is required)"
    ) in result.stdout
