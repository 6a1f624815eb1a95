"""The engine seam (docs/scaling.md, "Citus: every role"): a repository asks the engine's driver
to do what differs between plain PostgreSQL and Citus and never asks which engine it is; the
two drivers implement the same interface."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import notify_queue.repositories
from notify_queue.repositories.driver import Driver
from notify_queue.repositories.engine import DRIVERS

REPOSITORIES = Path(notify_queue.repositories.__file__).parent
# The seam itself: the engine's detection and the drivers.
SEAM = {"engine.py", "driver.py", "engine_postgresql.py", "engine_citus.py"}
# The worker's claim and completion still choose their shape themselves.
STILL_CHOOSING = {
    ("delivery.py", "notifications_claim"),
    ("delivery.py", "deliveries_complete"),
    ("delivery.py", "_citus"),
}


def _chooses_engine(node: ast.AST) -> bool:
    """`Engine.CITUS` / `Engine.POSTGRESQL` named, or a repository's own `_citus()` called."""
    for n in ast.walk(node):
        if (
            isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name)
            and n.value.id == "Engine"
            and n.attr in ("CITUS", "POSTGRESQL")
        ):
            return True
        if isinstance(n, ast.Attribute) and n.attr == "_citus":
            return True
    return False


def test_repositories_outside_the_seam_never_check_the_engine() -> None:
    choosing = set()
    for path in sorted(REPOSITORIES.glob("*.py")):
        if path.name in SEAM:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            is_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            if is_function and _chooses_engine(node):
                choosing.add((path.name, node.name))
    assert choosing <= STILL_CHOOSING


def test_both_drivers_implement_every_method_of_the_interface() -> None:
    wanted = {
        name
        for name, member in inspect.getmembers(Driver)
        if inspect.iscoroutinefunction(member) and not name.startswith("_")
    }
    assert wanted
    for engine, driver in DRIVERS.items():
        assert driver.engine is engine
        have = {
            name
            for name, member in inspect.getmembers(type(driver))
            if inspect.iscoroutinefunction(member) and not name.startswith("_")
        }
        assert have == wanted, engine
