"""The releases this checkout upgrades from, each built from this repository's own history into a
virtualenv of its own.

`git archive <commit>` of the repository the tests run in, installed (not editable) with its
runtime dependencies from PyPI into `~/.cache/notify-queue/upgrade-baseline/<full commit>/venv`
(or under `$NOTIFY_QUEUE_UPGRADE_CACHE`; beside the Kubernetes binaries and the Citus build, so a
fresh clone on the same machine does not install it again), so it runs exactly as that release's
image would: its own code, its own SQL, its own migrations. Built once per commit (a lock file
serialises concurrent test processes; a `built` marker, written last, says the build finished).
`BASELINES` holds the previous release and, for one release more, the one before
it (an upgrade that skips a release is supported for one release: docs/upgrading.md); each
release adds its own and drops the oldest. A checkout without such a commit in its history fails
the test with the command to fetch it: an upgrade test that quietly skips would let an upgrade
break unseen.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Baseline:
    release: str
    commit: str  # the release's commit (its tag `v<release>`), abbreviated


# The releases this one upgrades from, oldest first (CHANGELOG.md): 0.2.0, the previous one, and
# 0.1.0 for one release more.
BASELINES = (Baseline("0.1.0", "47fbd42"), Baseline("0.2.0", "f73ba7e"))
PREVIOUS = BASELINES[-1]
REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_ROOT = Path(
    os.environ.get("NOTIFY_QUEUE_UPGRADE_CACHE")
    or Path.home() / ".cache" / "notify-queue" / "upgrade-baseline"
)


def _git(*args: str) -> bytes:
    return subprocess.run(
        ["git", "-C", str(REPO_ROOT), *args], check=True, capture_output=True, timeout=120
    ).stdout


def baseline_commit(baseline: Baseline = PREVIOUS) -> str:
    """The full id of a baseline's commit, or a test failure that says how to get it."""
    try:
        return _git("rev-parse", "--verify", f"{baseline.commit}^{{commit}}").decode().strip()
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        pytest.fail(
            f"the upgrade tests need release {baseline.release} (commit {baseline.commit}) in "
            f"this repository's history ({REPO_ROOT}), and it is absent: "
            f"{detail.decode(errors='replace').strip() or exc}. A shallow clone lacks it: run "
            "`git fetch --unshallow` (in CI: check out with the full history).",
            pytrace=False,
        )


def baseline_venv(baseline: Baseline = PREVIOUS) -> Path:
    """A baseline release's virtualenv (built on first use); its `bin/notify-queue` runs it."""
    commit = baseline_commit(baseline)
    root = CACHE_ROOT / commit
    venv = root / "venv"
    marker = root / "built"
    if marker.exists():
        return venv
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{commit}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be building it right now
        if not marker.exists():
            _build(baseline, commit, root)
            marker.write_text(commit + "\n")
    return venv


def _build(baseline: Baseline, commit: str, root: Path) -> None:
    # A virtualenv's scripts name its absolute path, so it is built where it stays; a build that
    # died half-way (no marker) is thrown away and started again.
    shutil.rmtree(root, ignore_errors=True)
    source = root / "src"
    source.mkdir(parents=True)
    with tarfile.open(fileobj=BytesIO(_git("archive", "--format=tar", commit))) as tar:
        tar.extractall(source, filter="data")
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=300)
    pip = [str(root / "venv" / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    result = subprocess.run(
        [*pip, "install", "--quiet", str(source)], capture_output=True, text=True, timeout=1200
    )
    if result.returncode != 0:
        pytest.fail(
            f"installing release {baseline.release} ({commit}) from PyPI failed:\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}",
            pytrace=False,
        )
