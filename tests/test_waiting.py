"""Why a notification waits (CONTRACT section 10, docs/design.md "Why a notification waits"),
through a real `notify-queue api` and a real `notify-queue worker` process on one database.

Each cause the queue decides itself gives its reason on the notification (`waiting`: reason,
until, detail), in `GET /notifications?waiting=R`, and in the gauge `notify_queue_waiting` (every
reason always present): Scheduled (send time ahead), RecipientRateLimit (the recipient's window),
PolicyNotReady, QuietHours, ProviderRateLimit (a provider's send rate), Backoff (after a
temporary failure) and CircuitOpen (the only provider's circuit is open). A scheduled row whose
time has come, with no worker yet, is PENDING waiting NoWorker (no live worker serves its lane,
and no `until`: it is due as soon as one starts); once a worker serves it, it is sent.
DigestWindow and EscalationStep belong to the digest and escalation features; here they are
present in the gauge at 0.
"""

from __future__ import annotations

import socket
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from notify_queue.models import Policy, WaitingReason
from notify_queue.repositories.db import Database
from notify_queue.repositories.policies import PolicyRepository
from tests.chaos.harness import WorkerProcesses
from tests.support import eventually


def _closed_port() -> int:
    """A loopback port nothing listens on: every call there is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _providers_file(tmp_path: Path) -> str:
    providers = {
        "providers": [
            {"name": "mail-ok", "type": "simulated", "channels": ["email"]},
            # One send per 1,000 s: the second sms finds no slot within the worker's wait bound.
            {
                "name": "sms-slow",
                "type": "simulated",
                "channels": ["sms"],
                "rateLimit": {"perSecond": 0.001},
            },
            # Refuses every call; one failure opens its circuit for 10 minutes.
            {
                "name": "push-down",
                "type": "http",
                "channels": ["push"],
                "url": f"http://127.0.0.1:{_closed_port()}/send",
                "timeout": "2s",
                "circuitBreaker": {"failures": 1, "openFor": "600s"},
            },
        ],
        "chains": {"email": ["mail-ok"], "sms": ["sms-slow"], "push": ["push-down"]},
    }
    path = tmp_path / "providers.yaml"
    path.write_text(yaml.safe_dump(providers))
    return str(path)


async def _create(http: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    address = {} if "recipientId" in fields else {"channel": "email", "recipient": "a@example.com"}
    body = address | {"body": "hi"} | fields
    answer = await http.post(
        "/notifications", json=body, headers={"Idempotency-Key": uuid.uuid4().hex}
    )
    assert answer.status_code == 201, answer.text
    created: dict[str, Any] = answer.json()
    return created["notifications"][0] if "notifications" in created else created


async def _waiting_for(http: httpx.AsyncClient, id: str, reason: str) -> dict[str, Any]:
    """The notification once it waits for `reason` (polled: workers decide in their own time)."""

    async def check() -> dict[str, Any] | None:
        n: dict[str, Any] = (await http.get(f"/notifications/{id}")).json()
        return n if (n["waiting"] or {}).get("reason") == reason else None

    found: dict[str, Any] = await eventually(check, timeout=60, what=f"{id} waiting {reason}")
    return found


async def _listed(http: httpx.AsyncClient, reason: str) -> set[str]:
    answer = await http.get("/notifications", params={"waiting": reason, "limit": 1000})
    assert answer.status_code == 200, answer.text
    items = answer.json()["items"]
    assert all(i["status"] == "PENDING" and i["waiting"]["reason"] == reason for i in items)
    return {i["id"] for i in items}


async def _gauge(http: httpx.AsyncClient) -> dict[str, float]:
    text = (await http.get("/metrics")).text
    return {
        s.labels["reason"]: s.value
        for family in text_string_to_metric_families(text)
        if family.name == "notify_queue_waiting"
        for s in family.samples
    }


def _clock(moment: datetime) -> str:
    return moment.strftime("%H:%M")


async def test_each_cause_gives_its_reason_in_the_api_the_list_and_the_gauge(
    api: httpx.AsyncClient, workers: WorkerProcesses, db: Database, tmp_path: Path
) -> None:
    http = api
    policies = PolicyRepository(db)
    await policies.policy_upsert(policy=Policy(name="shop/held"), ready=False)
    await policies.policy_upsert(
        policy=Policy(name="shop/slow-retry", backoff_base_seconds=600, backoff_max_seconds=600)
    )
    now = datetime.now(UTC)
    quiet = {"start": _clock(now - timedelta(hours=2)), "end": _clock(now + timedelta(hours=2))}
    answer = await http.put(
        "/recipients/night-owl",
        json={
            "email": "owl@example.com",
            "timezone": "UTC",
            "preferences": {"quietHours": quiet},
        },
    )
    assert answer.status_code in (200, 201), answer.text

    # No worker yet. Scheduled: its send time is ahead, and `until` says when.
    later = await _create(http, delaySeconds=3600)
    assert later["waiting"]["reason"] == "Scheduled"
    assert later["waiting"]["until"] == later["sendAt"] and later["waiting"]["detail"]
    # A send time that has come: due, and no worker runs, so it waits NoWorker.
    soon = await _create(http, sendAt=(datetime.now(UTC) + timedelta(seconds=1)).isoformat())
    assert soon["waiting"]["reason"] == "Scheduled"

    async def due() -> bool:
        n = (await http.get(f"/notifications/{soon['id']}")).json()
        waiting = n["waiting"] or {}
        return n["status"] == "PENDING" and waiting.get("reason") == "NoWorker"

    await eventually(due, what="the scheduled notification due, waiting NoWorker")
    assert await _listed(http, "NoWorker") == {soon["id"]}
    assert await _listed(http, "Scheduled") == {later["id"]}

    worker = workers.start(
        "--providers-file",
        _providers_file(tmp_path),
        "--channels",
        "email,sms,push",
        "--rate-limit",
        "1",
        "--rate-limit-window",
        "3600",
        "--poll-interval",
        "0.2",
        "--backoff-base",
        "0.05",
        "--backoff-max",
        "0.2",
    )
    await workers.ready(worker)

    first = await _create(http, recipient="busy@example.com")
    second = await _create(http, recipient="busy@example.com")
    held = await _create(http, recipient="held@example.com", policy="shop/held")
    night = await _create(http, recipientId="night-owl", channels=["email"])
    texts = [await _create(http, channel="sms", recipient=f"+491511234567{i}") for i in range(3)]
    backing_off = await _create(http, channel="push", recipient="tok-1", policy="shop/slow-retry")

    expected: dict[str, set[str]] = {
        "Scheduled": {later["id"]},
        "PolicyNotReady": {held["id"]},
        "QuietHours": {night["id"]},
        "Backoff": {backing_off["id"]},
    }
    sent_one = {first["id"], second["id"]}
    rate_limited: set[str] = set()

    async def one_of_two_waits_for_the_window() -> bool:
        rows = [(await http.get(f"/notifications/{i}")).json() for i in sent_one]
        waiting = {
            r["id"] for r in rows if (r["waiting"] or {}).get("reason") == "RecipientRateLimit"
        }
        rate_limited.update(waiting)
        return len(waiting) == 1 and any(r["status"] == "SENT" for r in rows)

    await eventually(one_of_two_waits_for_the_window, timeout=60, what="RecipientRateLimit")
    expected["RecipientRateLimit"] = rate_limited

    n = await _waiting_for(http, held["id"], "PolicyNotReady")
    assert "shop/held" in n["waiting"]["detail"] and n["attemptCount"] == 0
    n = await _waiting_for(http, night["id"], "QuietHours")
    assert n["waiting"]["until"] is not None and n["attemptCount"] == 0
    n = await _waiting_for(http, backing_off["id"], "Backoff")
    assert n["attemptCount"] == 1 and n["waiting"]["detail"].startswith("retry after attempt 1")

    limited: set[str] = set()

    async def texts_wait_for_the_provider() -> bool:
        rows = [(await http.get(f"/notifications/{t['id']}")).json() for t in texts]
        limited.clear()
        limited.update(
            r["id"] for r in rows if (r["waiting"] or {}).get("reason") == "ProviderRateLimit"
        )
        return len(limited) == 2 and sum(r["status"] == "SENT" for r in rows) == 1

    await eventually(texts_wait_for_the_provider, timeout=60, what="ProviderRateLimit")
    expected["ProviderRateLimit"] = set(limited)
    for i in limited:
        n = (await http.get(f"/notifications/{i}")).json()
        assert "sms-slow" in n["waiting"]["detail"] and n["attemptCount"] == 0
        assert n["waiting"]["until"] is not None

    # The refused call opened push-down's circuit: the next push is not tried at all.
    blocked = await _create(http, channel="push", recipient="tok-2")
    n = await _waiting_for(http, blocked["id"], "CircuitOpen")
    assert n["waiting"]["detail"] == "provider push-down's circuit is open"
    assert n["attemptCount"] == 0 and n["waiting"]["until"] is not None
    expected["CircuitOpen"] = {blocked["id"]}

    want = {r.value: float(len(expected.get(r.value, ()))) for r in WaitingReason}

    async def lists_and_gauge_match() -> bool:
        lists = {reason: await _listed(http, reason) for reason in expected}
        return lists == expected and await _gauge(http) == want

    # PolicyNotReady is looked at again every 30 s: between its `until` and the next claim it
    # is due (not waiting), so the lists and the gauge are polled until they agree.
    await eventually(lists_and_gauge_match, timeout=60, what=f"lists {expected}, gauge {want}")
    assert worker.poll() is None, workers.log(worker)


async def test_an_unknown_waiting_reason_is_a_400_problem(api: httpx.AsyncClient) -> None:
    answer = await api.get("/notifications", params={"waiting": "Sleepy"})
    assert answer.status_code == 400
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert [e["field"] for e in answer.json()["errors"]] == ["waiting"]
