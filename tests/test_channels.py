"""The chat, webhook and incident channels through the model (docs/channels.md), with a real
`notify-queue api` and `notify-queue worker` process and the local vendor receiver
(tests/receivers.py): a recipient's destinations, the templates' chat, webhook and incident parts,
and escalation steps on chat and incident.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.chaos.harness import WorkerProcesses
from tests.receivers import VendorReceiver
from tests.support import eventually

ENV = {"SLACK_TOKEN": "xoxb-test-token", "PD_DB": "R0UT1NGKEY0000000000000000000DB1"}
FINAL = {"SENT", "FAILED", "DEAD_LETTERED"}
BLOCKS_TEMPLATE = (
    '{"text": "{{ app }} failed", "blocks": [{"type": "section", '
    '"text": {"type": "mrkdwn", "text": "*{{ app }}* failed"}}]}'
)


@pytest.fixture
async def receiver() -> AsyncIterator[VendorReceiver]:
    r = await VendorReceiver().start()
    yield r
    await r.stop()


async def _worker(
    workers: WorkerProcesses, tmp_path: Path, providers: list[dict[str, Any]], channels: str
) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(yaml.safe_dump({"providers": providers}))
    worker = workers.start(
        "--providers-file", str(path), "--channels", channels,
        "--poll-interval", "0.1", "--backoff-base", "0.05", env=ENV,
    )  # fmt: skip
    await workers.ready(worker)


def _slack(receiver: VendorReceiver) -> dict[str, Any]:
    return {
        "name": "slack-main", "type": "slack", "channels": ["chat"],
        "url": f"{receiver.base}/slack/api", "tokenFrom": {"env": "SLACK_TOKEN"},
        "destinations": {"ops": "C0OPS", "dev": "C0DEV"},
    }  # fmt: skip


async def _post(http: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
    return await http.post(
        "/notifications", json=body, headers={"Idempotency-Key": uuid.uuid4().hex}
    )


async def _final(http: httpx.AsyncClient, id: str) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        n: dict[str, Any] = (await http.get(f"/notifications/{id}")).json()
        return n if n["status"] in FINAL else None

    found: dict[str, Any] = await eventually(done, timeout=30, what=f"{id} final")
    return found


async def test_chat_reaches_slack_with_the_rendered_block_kit_for_a_destination_and_a_contact(
    api: httpx.AsyncClient, receiver: VendorReceiver, workers: WorkerProcesses, tmp_path: Path
) -> None:
    await _worker(workers, tmp_path, [_slack(receiver)], "chat")
    put = await api.put(
        "/templates/deploy-failed", json={"channels": {"chat": {"body": BLOCKS_TEMPLATE}}}
    )
    assert put.status_code == 201, put.text
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "*web* failed"}}]

    direct = await _post(
        api,
        {
            "channel": "chat",
            "recipient": "ops",
            "template": "deploy-failed",
            "data": {"app": "web"},
        },
    )
    assert direct.status_code == 201, direct.text
    assert (await _final(api, direct.json()["id"]))["status"] == "SENT"

    contact = await api.put("/recipients/team-dev", json={"chat": "dev"})
    assert contact.status_code == 201, contact.text
    assert contact.json()["chat"] == "dev"
    targeted = await _post(
        api,
        {"recipientId": "team-dev", "channels": ["chat"], "template": "deploy-failed",
         "data": {"app": "web"}},
    )  # fmt: skip
    assert targeted.status_code == 201, targeted.text
    (notification,) = targeted.json()["notifications"]
    assert notification["channel"] == "chat" and notification["recipient"] == "dev"
    assert (await _final(api, notification["id"]))["status"] == "SENT"

    sent = {r.json["channel"]: r.json for r in receiver.of("slack")}
    assert sent == {
        "C0OPS": {"channel": "C0OPS", "text": "web failed", "blocks": blocks},
        "C0DEV": {"channel": "C0DEV", "text": "web failed", "blocks": blocks},
    }


async def test_destinations_are_names_in_both_the_request_and_the_recipient(
    api: httpx.AsyncClient,
) -> None:
    bad = await _post(api, {"channel": "chat", "recipient": "https://hooks.example/x", "body": "b"})
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "recipient", bad.text
    contact = await api.put("/recipients/r1", json={"incident": "DB Team"})
    assert contact.status_code == 400, contact.text
    assert (await api.get("/recipients/r1")).status_code == 404
    stored = await api.put("/recipients/r1", json={"webhook": "ci", "incident": "db-team"})
    assert stored.status_code == 201, stored.text
    again = await api.put("/recipients/r1", json={"email": "a@example.com"})
    assert again.json()["webhook"] is None and again.json()["incident"] is None


async def test_a_webhook_template_that_is_no_json_is_refused_at_creation(
    api: httpx.AsyncClient,
) -> None:
    text = await api.put(
        "/templates/hook", json={"channels": {"webhook": {"body": "{{ app }} failed"}}}
    )
    assert text.status_code == 400, text.text
    assert text.json()["errors"][0]["field"] == "channels.webhook.body"
    assert (await api.get("/templates/hook")).status_code == 404

    shaped = await api.put(
        "/templates/hook", json={"channels": {"webhook": {"body": "{{ payload }}"}}}
    )
    assert shaped.status_code == 201, shaped.text
    not_json = await _post(
        api,
        {
            "channel": "webhook",
            "recipient": "ci",
            "template": "hook",
            "data": {"payload": "{oops}"},
        },
    )
    assert not_json.status_code == 400, not_json.text
    assert "webhook body" in not_json.json()["errors"][0]["message"]
    good = await _post(
        api,
        {"channel": "webhook", "recipient": "ci", "template": "hook",
         "data": {"payload": json.dumps({"app": "web"})}},
    )  # fmt: skip
    assert good.status_code == 201, good.text
    assert json.loads(good.json()["body"]) == {"app": "web"}


async def test_an_incident_escalation_step_reaches_pagerduty(
    api: httpx.AsyncClient, receiver: VendorReceiver, workers: WorkerProcesses, tmp_path: Path
) -> None:
    pd = {
        "name": "pd", "type": "pagerduty", "channels": ["incident"],
        "url": f"{receiver.base}/pagerduty/v2/enqueue",
        "destinations": {"db-team": {"routingKeyFrom": {"env": "PD_DB"}}},
    }  # fmt: skip
    await _worker(workers, tmp_path, [_slack(receiver), pd], "chat,incident")
    put = await api.put("/recipients/oncall", json={"chat": "ops", "incident": "db-team"})
    assert put.status_code == 201, put.text
    steps = [{"channel": "chat"}, {"channel": "incident", "afterSeconds": 1}]
    created = await _post(
        api,
        {"recipientId": "oncall", "subject": "DB down", "body": "primary unreachable",
         "priority": "HIGH", "escalation": {"steps": steps}},
    )  # fmt: skip
    assert created.status_code == 201, created.text
    chat, incident = created.json()["notifications"]
    assert (await _final(api, chat["id"]))["status"] == "SENT"
    assert (await _final(api, incident["id"]))["status"] == "SENT"
    (event,) = [r.json for r in receiver.of("pagerduty")]
    assert event["routing_key"] == ENV["PD_DB"] and event["event_action"] == "trigger"
    assert event["dedup_key"] == incident["id"]
    assert event["payload"]["summary"] == "DB down"
    assert event["payload"]["severity"] == "critical"
