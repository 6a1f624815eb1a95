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


def _squawk(*files: Path, in_transaction: bool = True) -> subprocess.CompletedProcess[str]:
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
            *([] if in_transaction else ["--no-assume-in-transaction"]),
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
    # A `transaction: none` step runs outside a transaction (schema.migrate), and is checked so.
    unwrapped = [p for p in after if _outside_transaction(p)]
    wrapped = [p for p in after if p not in unwrapped]
    for files, in_transaction in ((wrapped, True), (unwrapped, False)):
        result = _squawk(*files, in_transaction=in_transaction)
        assert result.returncode == 0, result.stdout + result.stderr


def _outside_transaction(path: Path) -> bool:
    return "-- transaction: none" in path.read_text().splitlines()


def test_no_index_on_the_queue_is_built_without_concurrently() -> None:
    """The rule the index builds on nq_jobs once waived: each holds every create and claim back
    for the length of its build on a backlog (docs/upgrading.md, "Index builds on the queue")."""
    after = [
        p for p in sorted(MIGRATIONS.glob("[0-9]*_*.sql")) if int(p.name[:4]) > BASELINE_VERSION
    ]
    rule = "squawk-ignore require-concurrent-index-creation"
    waived = [p.name for p in after if rule in p.read_text()]
    # 0009 indexes nq_rate_windows, a table it creates, empty.
    assert waived == ["0009_release_0_2_0.sql"], waived


def test_the_rules_catch_the_rename_that_broke_the_0_1_0_roll_out(tmp_path: Path) -> None:
    # 0.1.0's step 0008 renamed the table its predecessor wrote (squashed away since).
    step = tmp_path / "0008_queue_and_delivery_log.sql"
    step.write_text("ALTER TABLE nq_notifications RENAME TO nq_notifications_0007;\n")
    result = _squawk(step)
    assert result.returncode != 0
    assert "renaming-table" in result.stdout, result.stdout
