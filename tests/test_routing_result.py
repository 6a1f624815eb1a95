"""The routed result carries every field of the provider's answer.

The routing rebuilds the answer field by field on every delivery (dataclasses.replace cost twice
as much); a field added to DeliveryResult and not carried there would be dropped silently.
"""

from __future__ import annotations

import json
from dataclasses import fields, replace

from notify_queue.models import DeliveryResult, Outcome
from notify_queue.worker.routing import _finish


def test_the_routed_result_keeps_every_field_of_the_answer() -> None:
    answer = DeliveryResult(
        Outcome.TEMPORARY_FAILURE,
        provider_message_id="m-1",
        error="busy",
        retry_after_seconds=2.5,
        nothing_sent=True,
        address_gone=True,
        waiting_detail="provider sms-b's circuit is open",
    )
    attempts = [{"provider": "sms-b", "outcome": "TEMPORARY_FAILURE"}]
    routed = _finish(answer, "sms-b", attempts, "sms-b")
    assert routed == replace(
        answer, provider="sms-b", attempts_json=routed.attempts_json, bound_provider="sms-b"
    )
    assert routed.attempts_json is not None and json.loads(routed.attempts_json) == attempts
    # Every field differs from its default here, so one that was not carried would show.
    default = DeliveryResult(Outcome.SENT)
    assert [
        f.name
        for f in fields(DeliveryResult)
        if getattr(routed, f.name) == getattr(default, f.name)
    ] == []
