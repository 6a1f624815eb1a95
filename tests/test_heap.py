"""A role's process freezes its start-up heap once set up (notify_queue.heap); a process that
only runs a role's code, as these tests do, keeps its collector as it was."""

from __future__ import annotations

import gc

import pytest

from notify_queue import heap


def test_settle_freezes_only_in_a_role_process(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gc.get_freeze_count() == 0
    monkeypatch.setattr(heap, "_enabled", False)
    heap.settle()
    assert gc.get_freeze_count() == 0  # a test process running a role: nothing frozen
    monkeypatch.setattr(heap, "_enabled", True)
    try:
        heap.settle()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
