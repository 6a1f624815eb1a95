"""The escalation-acknowledge race on plain PostgreSQL (the scenario: tests/escalation_race.py).

The guard is the claim's read of the escalation's state (functions/nq_claim.sql, "ESCALATION
GUARD").
The negative control, `without_guard`, runs the same worker with that read replaced by `false`:
step i is then sent after the acknowledgement, every time.
"""

from __future__ import annotations

import pytest

from tests.escalation_race import no_step_is_sent_after_the_acknowledgement_committed
from tests.support import replace_in_function

GUARD = """ELSE EXISTS (SELECT 1 FROM nq_escalations e
                             WHERE e.bucket = n.bucket AND e.id = n.escalation_id
                               AND e.acknowledged_at IS NOT NULL) END AS acknowledged"""


@pytest.mark.parametrize("guard", ["with_guard", "without_guard"])
async def test_no_step_is_sent_after_the_acknowledgement_committed(
    database_url: str, guard: str
) -> None:
    if guard == "without_guard":
        await replace_in_function(
            database_url, "nq_claim_v2", GUARD, "ELSE false END AS acknowledged"
        )
    await no_step_is_sent_after_the_acknowledgement_committed(
        database_url, guarded=guard == "with_guard"
    )
