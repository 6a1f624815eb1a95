"""The data files ship inside the package. A regular (non-editable) install of the wheel finds
the CRDs where `notify-queue up --kubernetes` looks (`devcluster.DEFAULT_CRD_DIR`), byte for byte
the project's crds/ (the one source of truth; scripts/sync-chart-crds.sh makes the copies), and
every SQL file of the repositories (statements, migrations, the Citus folder) where they load."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.shipping.support import ROOT


@pytest.fixture(scope="module")
def wheel_install(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The wheel built from the checkout, and the directory it is installed into."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        timeout=300,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("notify_queue-*.whl")
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
    return wheel, site


def _run_installed(site: Path, cwd: Path, probe: str) -> list[str]:
    """`probe` run by a Python that imports the installed wheel, not the checkout."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, "-c", probe],
        check=True,
        timeout=60,
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
    ).stdout.split()


def test_a_wheel_install_finds_the_crds_where_up_looks_for_them(
    wheel_install: tuple[Path, Path],
) -> None:
    wheel, site = wheel_install
    with zipfile.ZipFile(wheel) as archive:
        shipped = sorted(n for n in archive.namelist() if n.startswith("notify_queue/crds/"))
    ours = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    assert shipped == [f"notify_queue/crds/{name}" for name in ours]

    probe = (
        "import notify_queue.devcluster as d; print(d.__file__); "
        "print('\\n'.join(sorted(p.name for p in d.DEFAULT_CRD_DIR.glob('*.yaml'))))"
    )
    lines = _run_installed(site, wheel.parent, probe)
    assert lines[0].startswith(str(site)), "imported the checkout, not the installed wheel"
    assert lines[1:] == ours
    for name in ours:
        installed = site / "notify_queue" / "crds" / name
        assert installed.read_bytes() == (ROOT / "crds" / name).read_bytes()


def test_a_wheel_install_loads_every_sql_file_of_the_repositories(
    wheel_install: tuple[Path, Path],
) -> None:
    wheel, site = wheel_install
    source = ROOT / "src" / "notify_queue" / "repositories"
    ours = sorted(str(p.relative_to(source)) for p in source.rglob("*.sql"))
    installed = site / "notify_queue" / "repositories"
    assert sorted(str(p.relative_to(installed)) for p in installed.rglob("*.sql")) == ours

    # The loaders read them from the installed package: the named queries (the Citus
    # coordinator's among them) and the Citus layout and functions that `migrate` runs.
    probe = (
        "from notify_queue.repositories import queries, schema; print(queries.__file__); "
        "print(len(queries.QUERIES), 'citus_finish' in queries.QUERIES); "
        "print(*(len(text) > 0 for text in schema._read_layout()))"
    )
    lines = _run_installed(site, wheel.parent, probe)
    assert lines[0].startswith(str(site)), "imported the checkout, not the installed wheel"
    from notify_queue.repositories.queries import QUERIES

    assert lines[1:] == [str(len(QUERIES)), "True", "True", "True"]
