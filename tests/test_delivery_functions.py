"""The delivery path's functions are source code (repositories/functions/, docs/design.md "The
completer"): each is defined in one file of its own, by `CREATE OR REPLACE`, and in no migration;
and each runs its steps as statements of their own, none a write that happens only because a
later query reads it (`WHERE (SELECT count(*) FROM w) >= 0`, `x IS NOT DISTINCT FROM x`): a
side effect a planner may drop when the query changes."""

from __future__ import annotations

import re
from importlib import resources

import pytest

ROOT = resources.files("notify_queue.repositories")
DELIVERY_FUNCTIONS = (
    "nq_attempts_append",
    "nq_claim_v2",
    "nq_claim_lock_v2",
    "nq_complete_deliveries",
    "nq_finish_held",
    "nq_finish_results",
    "nq_give_back_places",
    "nq_recover_expired_leases",
    "nq_release_claims",
    "nq_retry",
)
# The steps read top-down: none of these is kept running by a read of its result.
STEPWISE = (
    "nq_claim_v2",
    "nq_claim_lock_v2",
    "nq_complete_deliveries",
    "nq_finish_held",
    "nq_recover_expired_leases",
    "nq_release_claims",
    "nq_retry",
)
KEPT_ALIVE = re.compile(
    r"\(SELECT count\(\*\) FROM \w+\) >= 0"
    r"|\(SELECT n FROM (\w+)\) IS NOT DISTINCT FROM \(SELECT n FROM \1\)"
)


def _migrations() -> str:
    folder = ROOT.joinpath("migrations")
    return "\n".join(e.read_text("utf-8") for e in folder.iterdir() if e.name.endswith(".sql"))


@pytest.mark.parametrize("name", DELIVERY_FUNCTIONS)
def test_a_delivery_function_is_defined_in_its_own_file_and_in_no_migration(name: str) -> None:
    source = ROOT.joinpath("functions", f"{name}.sql").read_text("utf-8")
    assert len(re.findall(rf"CREATE OR REPLACE FUNCTION {name}\(", source)) == 1
    assert not re.search(rf"CREATE (OR REPLACE )?FUNCTION {name}\(", _migrations())


@pytest.mark.parametrize("name", STEPWISE)
def test_no_step_of_a_delivery_function_runs_only_because_it_is_read(name: str) -> None:
    source = ROOT.joinpath("functions", f"{name}.sql").read_text("utf-8")
    assert not KEPT_ALIVE.search(source)


def test_the_worker_statements_keep_no_step_alive_by_reading_it() -> None:
    assert not KEPT_ALIVE.search(ROOT.joinpath("sql", "delivery.sql").read_text("utf-8"))
