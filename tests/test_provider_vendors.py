"""The vendor provider types (docs/providers.md, "Chat, webhook and incident providers") through a
real `notify-queue api` and a real `notify-queue worker` process, against a local receiver that
speaks each vendor's wire format (tests/receivers.py `VendorReceiver`): Slack `chat.postMessage`,
a Teams Workflows webhook, a plain webhook with Standard Webhooks signing, PagerDuty Events API v2
and Opsgenie's Alert API.

Each type sends the request its vendor documents, and each scripted answer gives its outcome:
success is SENT; 429 with `Retry-After` (Slack's `ratelimited`) defers by that much; the vendor's
refusals (bad auth, unknown channel or team, an invalid event) fail permanently with its reason
in `lastError`; 5xx is retried, and PagerDuty's retry keeps the `dedup_key`. A destination the
provider does not map fails permanently, naming it, with nothing sent; a URL as recipient is such a
destination, so no client-supplied URL is ever reached. Slack's default limit of one message per
second per channel spaces the sends to one channel, and only those.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from standardwebhooks.webhooks import Webhook

from notify_queue.models import Channel, Outcome
from notify_queue.providers import build_providers, trusted_session
from notify_queue.providers.base import DeliveryRequest
from notify_queue.providers.specs import ProviderSpecs
from tests.chaos.harness import WorkerProcesses
from tests.receivers import VendorReceiver
from tests.support import eventually

SIGNING_SECRET = "whsec_" + "c2VjcmV0LWZvci12ZW5kb3ItdGVzdHMtMzItYnl0ZXMh"
ENV = {
    "SLACK_TOKEN": "xoxb-test-token",
    "OG_KEY": "og-key-1",
    "PD_DB": "R0UT1NGKEY0000000000000000000DB1",
    "HOOK_SECRET": SIGNING_SECRET,
}
FINAL = {"SENT", "FAILED", "DEAD_LETTERED"}


@pytest.fixture
async def receiver() -> AsyncIterator[VendorReceiver]:
    r = await VendorReceiver().start()
    yield r
    await r.stop()


StartWorker = Callable[[dict[str, Any], str], Awaitable[None]]


@pytest.fixture
def start_worker(workers: WorkerProcesses, tmp_path: Path) -> StartWorker:
    async def start(provider: dict[str, Any], channel: str) -> None:
        path = tmp_path / "providers.yaml"
        path.write_text(yaml.safe_dump({"providers": [provider]}))
        worker = workers.start(
            "--providers-file", str(path), "--channels", channel,
            "--poll-interval", "0.1", "--backoff-base", "0.05", "--backoff-max", "60",
            env=ENV,
        )  # fmt: skip
        await workers.ready(worker)

    return start


async def _create(http: httpx.AsyncClient, channel: str, recipient: str, **fields: Any) -> str:
    body = {"channel": channel, "recipient": recipient, "body": "deploy failed"} | fields
    answer = await http.post(
        "/notifications", json=body, headers={"Idempotency-Key": uuid.uuid4().hex}
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


async def _get(http: httpx.AsyncClient, id: str) -> dict[str, Any]:
    answer = await http.get(f"/notifications/{id}")
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


async def _final(http: httpx.AsyncClient, id: str) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        n = await _get(http, id)
        return n if n["status"] in FINAL else None

    found: dict[str, Any] = await eventually(done, timeout=30, what=f"{id} final")
    return found


async def _deferred(http: httpx.AsyncClient, id: str) -> dict[str, Any]:
    """The notification once an attempt failed and it waits for its next one."""

    async def waits() -> dict[str, Any] | None:
        n = await _get(http, id)
        return n if n["status"] == "PENDING" and n["attemptCount"] >= 1 else None

    found: dict[str, Any] = await eventually(waits, timeout=30, what=f"{id} deferred")
    return found


def _seconds_ahead(moment: str) -> float:
    return (datetime.fromisoformat(moment) - datetime.now(UTC)).total_seconds()


async def test_slack_posts_chat_messages_and_maps_each_answer(
    api: httpx.AsyncClient, receiver: VendorReceiver, start_worker: StartWorker
) -> None:
    await start_worker(
        {
            "name": "slack-main", "type": "slack", "channels": ["chat"],
            "url": f"{receiver.base}/slack/api", "tokenFrom": {"env": "SLACK_TOKEN"},
            "destinations": {"ops": "C0123ABC", "hook": f"{receiver.base}/slack/hook/ops"},
        },
        "chat",
    )  # fmt: skip
    sent = await _final(api, await _create(api, "chat", "ops", subject="Deployment failed"))
    assert sent["status"] == "SENT"
    request = receiver.of("slack")[0]
    assert request.headers["Authorization"] == "Bearer xoxb-test-token"
    assert request.headers["Content-Type"].startswith("application/json")
    assert request.json == {"channel": "C0123ABC", "text": "*Deployment failed*\ndeploy failed"}
    assert sent["providerMessageId"].startswith("C0123ABC/")

    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "*down*"}}]
    kit_body = json.dumps({"blocks": blocks})
    kit = await _final(api, await _create(api, "chat", "ops", body=kit_body))
    assert kit["status"] == "SENT"
    assert receiver.of("slack")[-1].json["blocks"] == blocks

    for code in ("channel_not_found", "not_in_channel", "invalid_auth"):
        receiver.script["slack"] = [code]
        failed = await _final(api, await _create(api, "chat", "ops"))
        assert failed["status"] == "FAILED" and code in failed["lastError"], failed

    receiver.script["slack"] = ["500"]
    retried = await _final(api, await _create(api, "chat", "ops"))
    assert retried["status"] == "SENT" and retried["attemptCount"] == 2, retried

    receiver.script["slack"] = ["ratelimited"]
    limited = await _deferred(api, await _create(api, "chat", "ops"))
    assert "ratelimited" in limited["lastError"]
    assert 20 < _seconds_ahead(limited["nextAttemptAt"]) <= 31, limited  # Retry-After: 30

    via_hook = await _final(api, await _create(api, "chat", "hook"))
    assert via_hook["status"] == "SENT"
    assert receiver.of("slack-hook")[0].json == {"text": "deploy failed"}


async def test_an_unmapped_destination_fails_permanently_naming_it_and_nothing_is_sent(
    api: httpx.AsyncClient, receiver: VendorReceiver, start_worker: StartWorker
) -> None:
    await start_worker(
        {
            "name": "hooks", "type": "webhook", "channels": ["webhook"],
            "destinations": {"ci": f"{receiver.base}/hooks/ci"},
        },
        "webhook",
    )  # fmt: skip
    unknown = await _final(api, await _create(api, "webhook", "nobody"))
    assert unknown["status"] == "FAILED" and "'nobody'" in unknown["lastError"], unknown
    assert unknown["attemptCount"] == 1
    assert receiver.received == []


async def test_a_url_as_recipient_is_no_destination_and_is_never_reached(
    receiver: VendorReceiver,
) -> None:
    """Whatever the API lets through, the provider only ever posts where the providers file
    says: a client-supplied URL reaches nothing (the outbound guard's concern does not arise)."""
    specs = ProviderSpecs.model_validate(
        {"providers": [{"name": "hooks", "type": "webhook", "channels": ["webhook"],
                        "destinations": {"ci": f"{receiver.base}/hooks/ci"}}]}
    )  # fmt: skip
    async with trusted_session(timeout_seconds=5) as session:
        provider = build_providers(specs, session)["hooks"]
        url = f"{receiver.base}/hooks/ci"
        request = DeliveryRequest(uuid.uuid4(), Channel.WEBHOOK, url, None, "hi")
        result = await provider.deliver(request)
    assert result.outcome is Outcome.PERMANENT_FAILURE
    assert result.error is not None and "is not mapped by provider hooks" in result.error
    assert receiver.received == []


async def test_webhooks_are_signed_and_send_the_json_body_or_the_envelope(
    api: httpx.AsyncClient, receiver: VendorReceiver, start_worker: StartWorker
) -> None:
    await start_worker(
        {
            "name": "hooks", "type": "webhook", "channels": ["webhook"],
            "destinations": {"ci": f"{receiver.base}/hooks/ci"},
            "secretFrom": {"env": "HOOK_SECRET"},
        },
        "webhook",
    )  # fmt: skip
    enveloped = await _create(api, "webhook", "ci", subject="Deploy", metadata={"app": "shop"})
    assert (await _final(api, enveloped))["status"] == "SENT"
    request = receiver.of("webhook")[0]
    assert request.json == {
        "subject": "Deploy", "body": "deploy failed", "id": enveloped, "metadata": {"app": "shop"}
    }  # fmt: skip
    assert request.headers["webhook-id"] == enveloped
    Webhook(SIGNING_SECRET).verify(request.body, request.headers)  # raises when not signed so

    own = await _final(api, await _create(api, "webhook", "ci", body='{"event": "deployed"}'))
    assert own["status"] == "SENT" and receiver.of("webhook")[1].json == {"event": "deployed"}

    receiver.script["webhook"] = ["500"]
    retried = await _final(api, await _create(api, "webhook", "ci"))
    assert retried["status"] == "SENT" and retried["attemptCount"] == 2
    first, second = receiver.of("webhook")[2:4]
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == retried["id"]

    receiver.script["webhook"] = ["404"]
    gone = await _final(api, await _create(api, "webhook", "ci"))
    assert gone["status"] == "FAILED" and "HTTP 404" in gone["lastError"]


async def test_teams_posts_an_adaptive_card_and_maps_each_answer(
    api: httpx.AsyncClient, receiver: VendorReceiver, start_worker: StartWorker
) -> None:
    await start_worker(
        {
            "name": "teams-main", "type": "teams", "channels": ["chat"],
            "destinations": {"ops": f"{receiver.base}/teams/ops"},
        },
        "chat",
    )  # fmt: skip
    sent = await _final(api, await _create(api, "chat", "ops", subject="Deployment failed"))
    assert sent["status"] == "SENT"
    message = receiver.of("teams")[0].json
    assert message["type"] == "message"
    [attachment] = message["attachments"]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = attachment["content"]
    assert card["type"] == "AdaptiveCard" and card["version"] == "1.4"
    assert [b["text"] for b in card["body"]] == ["Deployment failed", "deploy failed"]

    receiver.script["teams"] = ["400"]
    refused = await _final(api, await _create(api, "chat", "ops"))
    assert refused["status"] == "FAILED" and "HTTP 400" in refused["lastError"]

    receiver.script["teams"] = ["500"]
    retried = await _final(api, await _create(api, "chat", "ops"))
    assert retried["status"] == "SENT" and retried["attemptCount"] == 2

    receiver.script["teams"] = ["429"]
    limited = await _deferred(api, await _create(api, "chat", "ops"))
    assert "HTTP 429" in limited["lastError"]
    assert 20 < _seconds_ahead(limited["nextAttemptAt"]) <= 31, limited


async def test_pagerduty_triggers_with_the_notification_id_as_dedup_key(
    api: httpx.AsyncClient, receiver: VendorReceiver, start_worker: StartWorker
) -> None:
    await start_worker(
        {
            "name": "pd", "type": "pagerduty", "channels": ["incident"],
            "url": f"{receiver.base}/pagerduty/v2/enqueue",
            "destinations": {"db-team": {"routingKeyFrom": {"env": "PD_DB"}}},
        },
        "incident",
    )  # fmt: skip
    id = await _create(api, "incident", "db-team", subject="DB down", priority="HIGH")
    sent = await _final(api, id)
    assert sent["status"] == "SENT" and sent["providerMessageId"] == id
    event = receiver.of("pagerduty")[0].json
    assert event["routing_key"] == ENV["PD_DB"]
    assert event["event_action"] == "trigger" and event["dedup_key"] == id
    assert event["payload"]["summary"] == "DB down"
    assert event["payload"]["severity"] == "critical"
    assert event["payload"]["source"] == "notify-queue"
    assert event["payload"]["custom_details"]["body"] == "deploy failed"

    receiver.script["pagerduty"] = ["500"]
    retried_id = await _create(api, "incident", "db-team", priority="LOW")
    retried = await _final(api, retried_id)
    assert retried["status"] == "SENT" and retried["attemptCount"] == 2
    keys = [r.json["dedup_key"] for r in receiver.of("pagerduty")[1:]]
    assert keys == [retried_id, retried_id]
    assert receiver.of("pagerduty")[-1].json["payload"]["severity"] == "info"

    receiver.script["pagerduty"] = ["400"]
    invalid = await _final(api, await _create(api, "incident", "db-team"))
    assert invalid["status"] == "FAILED" and "Event object is invalid" in invalid["lastError"]
    assert "routing_key" in invalid["lastError"]

    receiver.script["pagerduty"] = ["429"]
    throttled = await _deferred(api, await _create(api, "incident", "db-team"))
    assert "HTTP 429" in throttled["lastError"]

    unknown = await _final(api, await _create(api, "incident", "web-team"))
    assert unknown["status"] == "FAILED" and "'web-team'" in unknown["lastError"]


async def test_opsgenie_creates_alerts_with_the_notification_id_as_alias(
    api: httpx.AsyncClient, receiver: VendorReceiver, start_worker: StartWorker
) -> None:
    await start_worker(
        {
            "name": "og", "type": "opsgenie", "channels": ["incident"],
            "url": f"{receiver.base}/opsgenie/v2/alerts", "tokenFrom": {"env": "OG_KEY"},
            "destinations": {"db-team": "db"},
        },
        "incident",
    )  # fmt: skip
    id = await _create(api, "incident", "db-team", subject="DB down", metadata={"cluster": "eu"})
    sent = await _final(api, id)
    assert sent["status"] == "SENT" and sent["providerMessageId"].startswith("og-")
    request = receiver.of("opsgenie")[0]
    assert request.headers["Authorization"] == "GenieKey og-key-1"
    alert = request.json
    assert alert["alias"] == id and alert["message"] == "DB down"
    assert alert["responders"] == [{"type": "team", "name": "db"}]
    assert alert["description"] == "deploy failed" and alert["priority"] == "P3"
    assert alert["details"] == {"cluster": "eu"}

    for code, words in (("401", "Could not authenticate"), ("422", "not processable")):
        receiver.script["opsgenie"] = [code]
        refused = await _final(api, await _create(api, "incident", "db-team"))
        assert refused["status"] == "FAILED" and words in refused["lastError"], refused

    receiver.script["opsgenie"] = ["500"]
    retried_id = await _create(api, "incident", "db-team")
    retried = await _final(api, retried_id)
    assert retried["status"] == "SENT" and retried["attemptCount"] == 2
    assert [r.json["alias"] for r in receiver.of("opsgenie")[-2:]] == [retried_id, retried_id]

    receiver.script["opsgenie"] = ["429"]
    throttled = await _deferred(api, await _create(api, "incident", "db-team"))
    assert "HTTP 429" in throttled["lastError"]
    assert 20 < _seconds_ahead(throttled["nextAttemptAt"]) <= 31, throttled


async def test_slack_sends_at_most_one_message_per_second_to_each_channel(
    api: httpx.AsyncClient, receiver: VendorReceiver, start_worker: StartWorker
) -> None:
    await start_worker(
        {
            "name": "slack-main", "type": "slack", "channels": ["chat"],
            "url": f"{receiver.base}/slack/api", "tokenFrom": {"env": "SLACK_TOKEN"},
            "destinations": {"ops": "C0OPS", "dev": "C0DEV"},
        },
        "chat",
    )  # fmt: skip
    ids = [await _create(api, "chat", "ops", body=f"ops {i}") for i in range(4)]
    ids += [await _create(api, "chat", "dev", body="dev 0")]
    for id in ids:
        assert (await _final(api, id))["status"] == "SENT"
    ops = [r.at for r in receiver.of("slack") if r.json["channel"] == "C0OPS"]
    assert len(ops) == 4
    gaps = [b - a for a, b in itertools.pairwise(ops)]
    assert min(gaps) >= 1.0, gaps
    # Another channel has its own schedule: its message is not held behind the ops channel's.
    dev = next(r.at for r in receiver.of("slack") if r.json["channel"] == "C0DEV")
    assert dev < ops[-1], (dev, ops)


async def test_acknowledging_an_escalation_resolves_its_pagerduty_incident_once(
    api: httpx.AsyncClient,
    receiver: VendorReceiver,
    workers: WorkerProcesses,
    tmp_path: Path,
    database_url: str,
) -> None:
    providers = {
        "providers": [
            {"name": "pd", "type": "pagerduty", "channels": ["incident"],
             "url": f"{receiver.base}/pagerduty/v2/enqueue",
             "destinations": {"db-team": {"routingKeyFrom": {"env": "PD_DB"}}},
             "resolveOnAcknowledge": True},
            {"name": "texts", "type": "simulated", "channels": ["sms"]},
        ]
    }  # fmt: skip
    path = tmp_path / "providers.yaml"
    path.write_text(yaml.safe_dump(providers))
    worker = workers.start(
        "--providers-file", str(path), "--channels", "sms,incident",
        "--poll-interval", "0.1", "--backoff-base", "0.05", env=ENV,
    )  # fmt: skip
    await workers.ready(worker)
    answer = await api.put(
        "/recipients/oncall", json={"phone": "+4915112345678", "incident": "db-team"}
    )
    assert answer.status_code == 201, answer.text
    created = await api.post(
        "/notifications",
        json={
            "recipientId": "oncall", "subject": "DB down", "body": "primary unreachable",
            "priority": "HIGH",
            "escalation": {
                "steps": [{"channel": "incident"}, {"channel": "sms", "afterSeconds": 600}]
            },
        },
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )  # fmt: skip
    assert created.status_code == 201, created.text
    escalation = created.json()["escalation"]["id"]
    first, second = (n["id"] for n in created.json()["notifications"])
    assert (await _final(api, first))["status"] == "SENT"

    for _ in range(2):  # a repeated acknowledgement resolves nothing twice
        acked = await api.post(f"/escalations/{escalation}/acknowledge", json={"by": "ana"})
        assert acked.status_code == 200, acked.text

    async def resolved() -> list[Any]:
        return [r.json for r in receiver.of("pagerduty") if r.json["event_action"] == "resolve"]

    events = await eventually(resolved, timeout=30, what="the resolve event")
    assert events == [{"routing_key": ENV["PD_DB"], "event_action": "resolve", "dedup_key": first}]
    triggers = [r.json for r in receiver.of("pagerduty") if r.json["event_action"] == "trigger"]
    assert [t["dedup_key"] for t in triggers] == [first]

    async def resolves_final() -> list[Any] | None:
        # The receiver answers before the worker records the send: wait for its completion.
        listed = await api.get("/notifications", params={"channel": "incident", "limit": 10})
        found = [n for n in listed.json()["items"] if n["id"] != first]
        done = found and all(n["status"] not in ("PENDING", "PROCESSING") for n in found)
        return found if done else None

    resolves = await eventually(resolves_final, timeout=30, what="the resolve's completion")
    assert len(resolves) == 1 and resolves[0]["status"] == "SENT", resolves
    assert resolves[0]["provider"] == "pd"
    assert (await _get(api, second))["status"] == "CANCELLED"
