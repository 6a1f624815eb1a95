"""NotificationPolicies on a real kube-apiserver: mirrored into PostgreSQL with a Ready condition,
their rate limit and retry settings obeyed by a real worker, their webhook signed with the key
from a Secret (and re-mirrored when the Secret rotates), and finished Notifications deleted after
the policy's ttlSecondsAfterFinished."""

from __future__ import annotations

import base64
import secrets
import time
from datetime import UTC, datetime

import pytest
from standardwebhooks import Webhook

from notify_queue.devcluster import LocalControlPlane
from notify_queue.models import Policy
from notify_queue.repositories.db import Database
from notify_queue.repositories.policies import PolicyRepository
from tests.operator.support import (
    Kube,
    OperatorThread,
    condition,
    notification,
    phase,
    policy,
    running_worker,
    settings_for,
)
from tests.receivers import WebhookReceiver
from tests.support import eventually

pytestmark = pytest.mark.kubernetes


def _whsec() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def _secret(namespace: str, name: str, **data: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "stringData": data,
    }


async def _ready(kube: Kube, namespace: str, name: str, generation: int = 1) -> dict[str, object]:
    async def check() -> object:
        obj = await kube.get("NotificationPolicy", namespace, name)
        ready = condition(obj, "Ready")
        return (
            ready
            and ready["status"] == "True"
            and obj["status"].get("observedGeneration") == generation
            and obj
        )

    return await eventually(check, timeout=15)  # type: ignore[no-any-return]


async def _phase_of(kube: Kube, namespace: str, name: str) -> str | None:
    return phase(await kube.get("Notification", namespace, name))


async def test_a_policy_is_mirrored_and_reports_ready_for_each_generation(
    kube: Kube,
    namespace: str,
    operator: OperatorThread,
    db: Database,
    control_plane: LocalControlPlane,
) -> None:
    await kube.create(
        policy(
            namespace,
            "default",
            rateLimit={"maxPerWindow": 3, "window": "90m"},
            retry={"maxAttempts": 4, "initialBackoff": "250ms", "maxBackoff": "1m"},
            ttlSecondsAfterFinished=600,
        )
    )
    obj = await _ready(kube, namespace, "default")
    assert condition(obj, "Ready")["reason"] == "Mirrored"
    assert await PolicyRepository(db).policy_get(name=f"{namespace}/default") == Policy(
        name=f"{namespace}/default",
        rate_limit=3,
        rate_window_seconds=5400.0,
        max_attempts=4,
        backoff_base_seconds=0.25,
        backoff_max_seconds=60.0,
        ttl_seconds_after_finished=600,
    )
    listing = control_plane.kubectl("get", "npol", "-n", namespace).stdout.splitlines()
    assert listing[1].split()[:5] == ["default", "3", "90m", "4", "True"]

    await kube.patch(
        "NotificationPolicy", namespace, "default", {"spec": {"rateLimit": {"maxPerWindow": 7}}}
    )
    await _ready(kube, namespace, "default", generation=2)
    mirrored = await PolicyRepository(db).policy_get(name=f"{namespace}/default")
    assert mirrored is not None and mirrored.rate_limit == 7

    await kube.delete("NotificationPolicy", namespace, "default")
    await eventually(lambda: _policy_gone(db, f"{namespace}/default"), timeout=10)


async def _policy_gone(db: Database, name: str) -> bool:
    return await PolicyRepository(db).policy_get(name=name) is None


async def test_the_rate_limit_of_the_default_policy_holds_back_the_third_notification(
    kube: Kube, namespace: str, operator: OperatorThread, db: Database, database_url: str
) -> None:
    await kube.create(policy(namespace, "default", rateLimit={"maxPerWindow": 2, "window": "1h"}))
    await _ready(kube, namespace, "default")
    names = ["one", "two", "three"]
    for name in names:
        await kube.create(notification(namespace, name, recipient="busy@example.com"))

    async with running_worker(settings_for(database_url, namespace), db):

        async def settled() -> list[str | None] | None:
            phases = sorted([await _phase_of(kube, namespace, n) or "" for n in names])
            return phases if phases == ["Pending", "Sent", "Sent"] else None

        await eventually(settled, timeout=20)

        async def deferred() -> dict[str, object] | None:
            for name in names:
                obj = await kube.get("Notification", namespace, name)
                status = (obj or {}).get("status") or {}
                if status.get("phase") == "Pending" and status.get("nextAttemptAt"):
                    wait = datetime.fromisoformat(status["nextAttemptAt"]) - datetime.now(UTC)
                    if wait.total_seconds() > 3000:
                        return status
            return None

        status = await eventually(deferred, timeout=10)
    assert status["attempts"] == 0


async def test_the_retry_settings_of_a_named_policy_decide_when_it_is_dead_lettered(
    kube: Kube, namespace: str, operator: OperatorThread, db: Database, database_url: str
) -> None:
    await kube.create(
        policy(
            namespace,
            "impatient",
            retry={"maxAttempts": 2, "initialBackoff": "50ms", "maxBackoff": "100ms"},
        )
    )
    await _ready(kube, namespace, "impatient")
    await kube.create(notification(namespace, "doomed", policy="impatient"))
    await kube.create(notification(namespace, "default-policy"))

    flaky = settings_for(
        database_url, namespace, sim_failure_rate=1.0, max_attempts=6, backoff_max=30.0
    )
    async with running_worker(flaky, db):

        async def dead() -> dict[str, object] | None:
            obj = await kube.get("Notification", namespace, "doomed")
            return obj if phase(obj) == "DeadLettered" else None

        obj = await eventually(dead, timeout=20)

        async def written() -> dict[str, object] | None:
            # Its first status may still wait out the operator's coalescing window.
            found = await kube.get("Notification", namespace, "default-policy")
            return found if phase(found) is not None else None

        other = await eventually(written, timeout=10)
    status = obj["status"]
    assert status["attempts"] == 2 and status["lastError"] == "simulated temporary failure"
    delivered = condition(obj, "Delivered")
    assert delivered["status"] == "False" and delivered["reason"] == "DeadLettered"
    assert phase(other) in ("Pending", "Processing")  # the worker's 6 attempts are not used up
    # Accepted is posted first; wait for the DeadLettered one itself.
    await eventually(lambda: _warning(kube, namespace, "doomed", "DeadLettered"), timeout=10)


async def test_the_webhook_is_signed_with_the_key_from_the_secret_and_follows_its_rotation(
    kube: Kube, namespace: str, operator: OperatorThread, db: Database, database_url: str
) -> None:
    receiver = await WebhookReceiver().start()
    first, second = _whsec(), _whsec()
    try:
        await kube.create(
            policy(
                namespace,
                "default",
                webhook={"url": receiver.url, "secretRef": {"name": "hooks", "key": "signing"}},
            )
        )

        # Without the Secret the policy is not Ready, and says why.
        async def waiting_for_secret() -> object:
            ready = condition(await kube.get("NotificationPolicy", namespace, "default"), "Ready")
            return ready and ready["status"] == "False" and ready

        ready = await eventually(waiting_for_secret, timeout=15)
        assert ready["reason"] == "SecretNotFound" and "hooks" in ready["message"]

        await kube.create(_secret(namespace, "hooks", signing=first))
        await _ready(kube, namespace, "default")
        await kube.create(notification(namespace, "signed"))
        async with running_worker(settings_for(database_url, namespace), db):
            await eventually(lambda: _received(receiver, 1), timeout=20)
            Webhook(first).verify(receiver.received[0].body, receiver.received[0].headers)
            assert receiver.received[0].json["status"] == "SENT"

            await kube.patch("Secret", namespace, "hooks", {"stringData": {"signing": second}})
            await eventually(
                lambda: _secrets_are(db, f"{namespace}/default", (second,)), timeout=15
            )
            await kube.create(notification(namespace, "rotated"))
            await eventually(lambda: _received(receiver, 2), timeout=20)
        Webhook(second).verify(receiver.received[1].body, receiver.received[1].headers)
    finally:
        await receiver.stop()


async def _received(receiver: WebhookReceiver, count: int) -> bool:
    return len(receiver.received) >= count


async def _secrets_are(db: Database, name: str, expected: tuple[str, ...]) -> bool:
    mirrored = await PolicyRepository(db).policy_get(name=name)
    return mirrored is not None and mirrored.webhook_secrets == expected


async def test_a_notification_naming_a_missing_policy_is_warned_and_sent_under_the_defaults(
    kube: Kube, namespace: str, operator: OperatorThread, db: Database, database_url: str
) -> None:
    await kube.create(notification(namespace, "orphan", policy="nowhere"))
    await kube.create(notification(namespace, "plain"))  # no policy: the absent `default`

    async def warned() -> list[dict[str, object]]:
        events = await kube.events(namespace, name="orphan")
        return [e for e in events if e["reason"] == "PolicyNotFound"]

    (event,) = await eventually(warned, timeout=15)
    assert event["type"] == "Warning" and "'nowhere'" in event["message"]

    async def accepted_says_so() -> object:
        accepted = condition(await kube.get("Notification", namespace, "orphan"), "Accepted")
        return accepted and "does not exist" in accepted["message"] and accepted

    accepted = await eventually(accepted_says_so, timeout=15)
    assert accepted["status"] == "True" and "'nowhere'" in accepted["message"]
    # The fallback stays: a worker sends it under its own defaults.
    async with running_worker(settings_for(database_url, namespace), db):
        await eventually(lambda: _both_sent(kube, namespace, "orphan", "plain"), timeout=20)
    sent = condition(await kube.get("Notification", namespace, "orphan"), "Accepted")
    assert sent is not None and "does not exist" in sent["message"]
    plain = condition(await kube.get("Notification", namespace, "plain"), "Accepted")
    assert plain is not None and "does not exist" not in plain["message"]
    assert not [e for e in await kube.events(namespace, name="plain") if e["type"] == "Warning"]


async def _both_sent(kube: Kube, namespace: str, first: str, second: str) -> bool:
    return [await _phase_of(kube, namespace, n) for n in (first, second)] == ["Sent", "Sent"]


async def test_finished_notifications_are_deleted_after_the_policy_ttl(
    kube: Kube, namespace: str, operator: OperatorThread, db: Database, database_url: str
) -> None:
    await kube.create(policy(namespace, "short-lived", ttlSecondsAfterFinished=1))
    await _ready(kube, namespace, "short-lived")
    await kube.create(notification(namespace, "ephemeral", policy="short-lived"))
    await kube.create(notification(namespace, "kept"))  # the default policy does not exist: kept

    async with running_worker(settings_for(database_url, namespace), db):
        await eventually(lambda: _phase_is(kube, namespace, "kept", "Sent"), timeout=20)
        sent_at = time.monotonic()
        await eventually(lambda: _gone(kube, namespace, "ephemeral"), timeout=15)
    assert time.monotonic() - sent_at < 10
    assert await _phase_of(kube, namespace, "kept") == "Sent"


async def _phase_is(kube: Kube, namespace: str, name: str, expected: str) -> bool:
    return await _phase_of(kube, namespace, name) == expected


async def _gone(kube: Kube, namespace: str, name: str) -> bool:
    return await kube.get("Notification", namespace, name) is None


async def _warning(kube: Kube, namespace: str, name: str, reason: str) -> bool:
    events = await kube.events(namespace, name=name)
    return any(e["reason"] == reason and e["type"] == "Warning" for e in events)
