"""The CRDs ship inside the package: a regular (non-editable) install of the wheel finds them
where `notify-queue up --kubernetes` looks (`devcluster.DEFAULT_CRD_DIR`), byte for byte the
project's crds/ (the one source of truth; scripts/sync-chart-crds.sh makes the copies)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.shipping.support import ROOT


def test_a_wheel_install_finds_the_crds_where_up_looks_for_them(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        timeout=300,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("notify_queue-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = sorted(n for n in archive.namelist() if n.startswith("notify_queue/crds/"))
    ours = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    assert shipped == [f"notify_queue/crds/{name}" for name in ours]

    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        timeout=300,
        capture_output=True,
    )
    probe = (
        "import notify_queue.devcluster as d; print(d.__file__); "
        "print('\\n'.join(sorted(p.name for p in d.DEFAULT_CRD_DIR.glob('*.yaml'))))"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    lines = subprocess.run(
        [sys.executable, "-c", probe],
        check=True,
        timeout=60,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    ).stdout.split()
    assert lines[0].startswith(str(site)), "imported the checkout, not the installed wheel"
    assert lines[1:] == ours
    for name in ours:
        installed = site / "notify_queue" / "crds" / name
        assert installed.read_bytes() == (ROOT / "crds" / name).read_bytes()
