"""The duplicate checks can fail: negative controls for the audit of the chaos tests, the soak
(two named providers) and the rolling upgrade (one provider, counted per key).

A real worker process delivers through the fake providers and the audit passes; then the test
calls a provider again with a key it already delivered, as a second worker would if it delivered
on a claim without checking the claim token, and the same audit must report the duplicate. The
provider answers that call as its idempotent success: the audit counts it anyway, because a
provider that ignored the key would have delivered the message twice.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import aiohttp

from notify_queue.repositories.db import Database
from tests.chaos.harness import all_final, audit, enqueue, new_notifications, poll, worker_flags
from tests.chaos.peers import ChaosProvider

NOTIFICATIONS = 12
ROOT = Path(__file__).resolve().parents[2]


async def _call_again(provider: ChaosProvider, key: uuid.UUID) -> tuple[int, str]:
    """One more delivery request with `key`, shaped as the worker's HTTP provider sends it."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            provider.url,
            json={"id": str(key), "body": "again"},
            headers={"Idempotency-Key": str(key)},
        ) as answer,
    ):
        return answer.status, (await answer.json())["messageId"]


async def test_a_key_answered_twice_by_the_fake_provider_is_counted_as_a_duplicate() -> None:
    provider = await ChaosProvider().start()
    try:
        key = uuid.uuid4()
        first = await _call_again(provider, key)
        second = await _call_again(provider, key)
    finally:
        await provider.stop()
    assert first == second == (200, "msg-1")  # the key absorbed the second call...
    # ...but it is counted: this is what the rolling upgrade's per-key check reads.
    assert provider.calls[str(key)] == provider.deliveries[str(key)] == 2
    assert (provider.duplicates(), provider.repeats, len(provider.message_ids)) == (1, 1, 1)


async def test_the_chaos_audit_reports_a_key_delivered_again_after_a_clean_run(
    db: Database, database_url: str, provider: ChaosProvider, spawn
) -> None:
    workers = spawn(database_url, *worker_flags(provider))
    workers.start()
    ids = await enqueue(db, new_notifications(NOTIFICATIONS, tag="control"))
    await poll(lambda: all_final(db, NOTIFICATIONS), timeout=60, what="every notification final")

    clean = await audit(db, ids, provider)
    assert (clean.problems, clean.duplicates, clean.deliveries) == ([], 0, NOTIFICATIONS)

    assert (await _call_again(provider, ids[3]))[0] == 200
    dirty = await audit(db, ids, provider)
    assert (dirty.duplicates, dirty.repeats_absorbed) == (1, 1)
    second_send = f"{ids[3]} answered 2 times on 1 claims"
    assert dirty.problems == [
        "1 keys answered twice by one provider: 1 repeat calls, 0 explained by faults",
        second_send,
    ]
    # Faults that lost outcomes may explain a repeat in number, never a second send on one claim.
    assert (await audit(db, ids, provider, repeats_explained=1)).problems == [second_send]


async def test_the_soak_audit_reports_a_key_repeated_at_one_provider_or_sent_by_both(
    db: Database, database_url: str, spawn, tmp_path: Path
) -> None:
    primary = await ChaosProvider().start()
    backup = await ChaosProvider().start()
    try:
        providers_file = tmp_path / "providers.yaml"
        providers_file.write_text(
            json.dumps(  # JSON is YAML; the soak's providers file
                {
                    "providers": [
                        {
                            "name": name,
                            "type": "http",
                            "channels": ["email", "sms", "push", "voice"],
                            "url": p.url,
                            "timeout": "5s",
                        }
                        for name, p in (("primary", primary), ("backup", backup))
                    ],
                    "chains": {c: ["primary", "backup"] for c in ("email", "sms", "push")},
                }
            )
        )
        workers = spawn(database_url, *worker_flags(None), "--providers-file", str(providers_file))
        workers.start()
        ids = await enqueue(db, new_notifications(NOTIFICATIONS, tag="soak-control"))
        await poll(
            lambda: all_final(db, NOTIFICATIONS), timeout=60, what="every notification final"
        )
        named = {"primary": primary, "backup": backup}

        clean = await audit(db, ids, providers=named)
        assert (clean.problems, clean.duplicates, clean.delivered_by_two_providers) == ([], 0, 0)

        await _call_again(primary, ids[0])
        repeated = await audit(db, ids, providers=named)
        assert repeated.problems == [
            "1 keys answered twice by one provider: 1 repeat calls, 0 explained by faults",
            f"{ids[0]} answered 2 times on 1 claims",
        ]

        await _call_again(backup, ids[1])  # the failover an unknown outcome must not cause
        both = await audit(db, ids, providers=named, repeats_explained=1)
        assert both.delivered_by_two_providers == 1
        assert sorted(both.problems) == sorted(
            [
                f"{ids[0]} answered 2 times on 1 claims",
                f"{ids[1]} answered 2 times on 1 claims",
                "1 keys delivered by two providers",
            ]
        )
    finally:
        await primary.stop()
        await backup.stop()


def test_the_soak_script_loads_the_audit_it_runs() -> None:
    """`make soak` is run by hand, not by the suite: at least its imports are checked here."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "soak.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "--minutes" in result.stdout
