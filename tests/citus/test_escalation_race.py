"""The escalation-acknowledge race on Citus (the scenario: tests/escalation_race.py), the schema
distributed by `notify-queue migrate`: the claim is the delegated nq_claim_admit_bucket
(repositories/citus/functions.sql), whose guard reads the escalation's state on the node that
holds the bucket, twice: once to cancel the acknowledged steps it locked, once in the statement
that hands out the rest. The negative control, `without_guard`, replaces both reads by `false`
(on every node: Citus propagates the distributed function's new definition)."""

from __future__ import annotations

import pytest

from tests.citus.test_layout import migrate
from tests.escalation_race import no_step_is_sent_after_the_acknowledgement_committed
from tests.support import replace_in_function

pytestmark = pytest.mark.citus

# The steps it cancels, then the ones the statement leaves out.
CANCEL_GUARD = """WHERE n.escalation_id IS NOT NULL
                 AND EXISTS (SELECT 1 FROM nq_escalations e
                             WHERE e.bucket = p_bucket AND e.id = n.escalation_id
                               AND e.acknowledged_at IS NOT NULL)), '{}'),"""
ADMIT_GUARD = """ELSE EXISTS (SELECT 1 FROM nq_escalations e
                                 WHERE e.bucket = p_bucket AND e.id = n.escalation_id
                                   AND e.acknowledged_at IS NOT NULL) END AS acknowledged"""


@pytest.mark.parametrize("guard", ["with_guard", "without_guard"])
async def test_no_step_is_sent_after_the_acknowledgement_committed_on_citus(
    citus_database: str, guard: str
) -> None:
    migrate(citus_database)
    if guard == "without_guard":
        admit = "nq_claim_admit_bucket"
        await replace_in_function(citus_database, admit, CANCEL_GUARD, "WHERE false), '{}'),")
        await replace_in_function(
            citus_database, admit, ADMIT_GUARD, "ELSE false END AS acknowledged"
        )
    await no_step_is_sent_after_the_acknowledgement_committed(
        citus_database, guarded=guard == "with_guard"
    )
