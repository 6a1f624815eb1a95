"""squawk, with the project's rules (.squawk.toml), on the migrations `migrate` runs while the
previous release serves: every file from 0009 on passes (exceptions are written next to their
statement), and the rules do catch what broke the 0.1.0 roll-out, 0008's table rename.
`make lint` runs the same command; this test keeps it in `make test` too."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from notify_queue.repositories.schema import BASELINE_VERSION
from tests.upgrade.baseline import REPO_ROOT

MIGRATIONS = REPO_ROOT / "src" / "notify_queue" / "repositories" / "migrations"


def _squawk(*files: Path) -> subprocess.CompletedProcess[str]:
    squawk = Path(sys.executable).with_name("squawk")
    command = str(squawk) if squawk.exists() else shutil.which("squawk")
    assert command, "squawk is not installed: pip install -e '.[test]'"
    return subprocess.run(
        [
            command,
            "--config",
            str(REPO_ROOT / ".squawk.toml"),
            "--reporter",
            "gcc",
            *map(str, files),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_every_migration_after_the_baseline_passes_squawk() -> None:
    after = [
        p for p in sorted(MIGRATIONS.glob("[0-9]*_*.sql")) if int(p.name[:4]) > BASELINE_VERSION
    ]
    if not after:
        return  # nothing after the baseline yet: nothing that could break the running release
    result = _squawk(*after)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rules_catch_the_rename_that_broke_the_0_1_0_roll_out() -> None:
    result = _squawk(*MIGRATIONS.glob("0008_*.sql"))
    assert result.returncode != 0
    assert "renaming-table" in result.stdout, result.stdout
