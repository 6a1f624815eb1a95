"""The escalation-acknowledge race on Citus (the scenario: tests/escalation_race.py), the schema
distributed by `notify-queue migrate`: the claim is the delegated nq_claim_admit_bucket
(repositories/citus_functions.sql), whose guard reads the escalation's state on the node that
holds the bucket. The negative control, `without_guard`, replaces that read by `false` (on
every node: Citus propagates the distributed function's new definition)."""

from __future__ import annotations

import pytest

from tests.citus.test_layout import migrate
from tests.escalation_race import no_step_is_sent_after_the_acknowledgement_committed
from tests.support import replace_in_function

pytestmark = pytest.mark.citus

GUARD = """WHERE n.escalation_id IS NOT NULL
                 AND EXISTS (SELECT 1 FROM nq_escalations e
                             WHERE e.bucket = p_bucket AND e.id = n.escalation_id
                               AND e.acknowledged_at IS NOT NULL)), '{}'),"""


@pytest.mark.parametrize("guard", ["with_guard", "without_guard"])
async def test_no_step_is_sent_after_the_acknowledgement_committed_on_citus(
    citus_database: str, guard: str
) -> None:
    migrate(citus_database)
    if guard == "without_guard":
        await replace_in_function(
            citus_database, "nq_claim_admit_bucket", GUARD, "WHERE false), '{}'),"
        )
    await no_step_is_sent_after_the_acknowledgement_committed(
        citus_database, guarded=guard == "with_guard"
    )
