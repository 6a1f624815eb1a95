"""A webhook event the operator writes reaches an idle worker at once (docs/design.md, "Wake-ups
and scheduling"): a Notification for a recipient opted out of everything is SUPPRESSED at its
creation by the operator, whose statement writes the event; a real `notify-queue worker` whose
looks are a minute apart POSTs it to a real receiver well before its next look."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.api.support import sql
from tests.operator.conftest import StartOperator
from tests.operator.support import GROUP_VERSION, Kube
from tests.receivers import WebhookReceiver
from tests.test_webhook_wakeups import arrives, relay_idle, role, warm_up, worker_args

pytestmark = pytest.mark.kubernetes


async def test_an_event_written_by_the_operator_reaches_an_idle_worker(
    kube: Kube,
    namespace: str,
    start_operator: StartOperator,
    database_url: str,
    tmp_path: Path,
) -> None:
    hooks = await WebhookReceiver().start()
    try:
        await start_operator(webhook_url=hooks.url)
        await sql(
            database_url,
            "INSERT INTO nq_recipients (id, email, opt_out_all) VALUES ('quiet', 'q@x.io', true)",
        )
        await warm_up(database_url, hooks)
        with role(database_url, tmp_path / "worker.log", *worker_args(hooks)):
            await relay_idle(database_url, hooks)
            await kube.create(
                {
                    "apiVersion": GROUP_VERSION,
                    "kind": "Notification",
                    "metadata": {"name": "ignored", "namespace": namespace},
                    "spec": {"recipientId": "quiet", "body": "hello"},
                }
            )
            written_at = time.monotonic()
            await arrives(hooks, "SUPPRESSED", written_at)
    finally:
        await hooks.stop()
