"""An upgrade from each release this one upgrades from (0.2.0, and 0.1.0 for one release more,
built from this repository's history) to this checkout, under load, through real processes: what
`helm upgrade` does, step by step.

The previous release migrates an empty database and serves: its API takes creates from a client
that never stops, its worker delivers to a real HTTP provider (counting deliveries per
Idempotency-Key), and its worker and a relay send webhook events to a real receiver. This
release's `migrate` runs (the chart's pre-upgrade hook) while they serve, and they keep serving
for 20 s more, their /readyz polled throughout. Then this release's API, worker and relay start,
the client moves to the new API (the Service's endpoints change), the old processes are stopped
with SIGTERM, and `migrate --contract` runs, refused while an old process is connected and
accepted once none is. Every notification is then drained and audited: no failed create, every
one SENT, each provider key delivered once, every webhook event delivered (docs/upgrading.md).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from notify_queue.repositories.db import Database
from tests.chaos.harness import WEBHOOK_SECRET, all_final, audit, read_rows, worker_flags
from tests.chaos.peers import ChaosProvider, SignedWebhookReceiver
from tests.support import eventually, free_port
from tests.upgrade.baseline import BASELINES, Baseline, baseline_venv
from tests.upgrade.support import CreateLoad, Release, wait_logged, wait_ready

pytestmark = pytest.mark.upgrade

# How long the previous release keeps serving on the new schema before the roll-out starts.
OVERLAP_SECONDS = 20.0


@pytest.fixture
async def peers() -> AsyncIterator[tuple[ChaosProvider, SignedWebhookReceiver]]:
    provider = await ChaosProvider().start()
    receiver = await SignedWebhookReceiver(secret=WEBHOOK_SECRET).start()
    yield provider, receiver
    await provider.stop()
    await receiver.stop()


async def _events_pending(url: str) -> int:
    async with Database(url, pool_size=1) as db:
        rows = await read_rows(
            db, "SELECT count(*) AS n FROM nq_webhook_events WHERE state <> 'delivered'"
        )
    return int(rows[0]["n"])


@pytest.mark.parametrize("baseline", BASELINES, ids=lambda b: f"from-{b.release}")
async def test_an_upgrade_under_load_fails_no_create_and_delivers_everything_once(
    baseline: Baseline,
    empty_database_url: str,
    peers: tuple[ChaosProvider, SignedWebhookReceiver],
    tmp_path: Path,
) -> None:
    url = empty_database_url
    provider, receiver = peers
    old = Release(baseline.release, baseline_venv(baseline) / "bin" / "python", url, tmp_path)
    new = Release("new", sys.executable, url, tmp_path)
    flags = worker_flags(provider, receiver)
    # A relay beside each release's worker (which relays too): both roles of the outbox.
    relay_flags = [
        *("--poll-interval", "0.2", "--outbound-allow", "127.0.0.1/32", "--log-level", "INFO"),
        *("--webhook-url", receiver.url, "--webhook-secret", receiver.secret),
        *(
            "--webhook-timeout",
            "1",
            "--webhook-backoff-base",
            "0.1",
            "--webhook-backoff-max",
            "0.5",
        ),
        *("--webhook-max-attempts", "30"),
    ]
    old_url, new_url = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    recipients = [f"upgrade-user-{n}" for n in range(8)]
    load = CreateLoad(target=old_url, recipients=recipients)
    try:
        # The previous release, installed and serving.
        installed = old.run("migrate")
        assert installed.returncode == 0, installed.stderr
        old_worker = old.start("worker", *flags)
        old_relay = old.start("relay", *relay_flags)
        old_api = old.start("api", "--port", old_url.rsplit(":", 1)[1])
        await wait_logged(old_worker, old, "worker started")
        await wait_logged(old_relay, old, "relay started")
        await wait_ready(old_url, old_api, old)
        async with httpx.AsyncClient(timeout=30) as http:
            for recipient in recipients:
                stored = await http.put(
                    f"{old_url}/recipients/{recipient}", json={"email": f"{recipient}@example.com"}
                )
                assert stored.status_code in (200, 201), stored.text
        load.start()
        await load.until("before", 30)

        # The pre-upgrade hook: this release's migrate while the old processes serve.
        load.phase = "migrate"
        migrated = await asyncio.to_thread(new.run, "migrate")
        assert migrated.returncode == 0, migrated.stderr

        # The old release keeps serving on the new schema, and stays ready (0.1.0's /readyz
        # compares the baseline ledger with its own latest version, 0.2.0's asks for its own
        # steps only).
        load.phase = "overlap"
        delivered_before_overlap = sum(provider.deliveries.values())
        old_not_ready: list[str] = []
        async with httpx.AsyncClient(timeout=10) as http:
            overlap_ends = time.monotonic() + OVERLAP_SECONDS
            while time.monotonic() < overlap_ends:
                ready = await http.get(old_url + "/readyz")
                if ready.status_code != 200:
                    old_not_ready.append(ready.text)
                await asyncio.sleep(0.5)
        delivered_in_overlap = sum(provider.deliveries.values()) - delivered_before_overlap
        # Contract steps wait while a process of the previous release is connected.
        too_early = await asyncio.to_thread(new.run, "migrate", "--contract")
        assert too_early.returncode == 1, too_early.stderr
        assert "older release" in too_early.stderr and "notify-queue-api" in too_early.stderr

        # The roll-out: new pods start, the Service moves, old pods get SIGTERM.
        new_worker = new.start("worker", *flags)
        new_relay = new.start("relay", *relay_flags)
        new_api = new.start("api", "--port", new_url.rsplit(":", 1)[1])
        await wait_logged(new_worker, new, "worker started")
        await wait_logged(new_relay, new, "relay started")
        await wait_ready(new_url, new_api, new)
        load.phase, load.target = "switch", new_url
        # The old pod leaves the Service's endpoints before it gets SIGTERM: what a preStop delay
        # gives a pod in Kubernetes. Without it a request that picked the old API a moment before
        # its SIGTERM meets a closed socket (seen: 2 failed creates of ~1,000 in one run).
        await load.drained_from(old_url)
        old_exits = [await old.stop(p) for p in (old_api, old_worker, old_relay)]
        load.phase = "after"
        await load.until("after", 30)
        await load.stop()

        # Once no old process is connected (its connections close as it exits), contract runs.
        async def contracted() -> bool:
            result = await asyncio.to_thread(new.run, "migrate", "--contract")
            return result.returncode == 0

        await eventually(contracted, timeout=60, interval=0.5, what="migrate --contract accepted")

        # Drain: every notification final, every webhook event relayed.
        async with Database(url, pool_size=2) as db:
            total = len(load.created)

            async def drained() -> bool:
                return await all_final(db, total) and await _events_pending(url) == 0

            await eventually(drained, timeout=180, interval=0.5, what="everything delivered")
            result = await audit(db, load.created, provider, receiver)
    finally:
        if not load._stop.is_set() and load._tasks:
            await load.stop()
        old.kill_all()
        new.kill_all()

    print(
        f"upgrade: {len(load.created)} created ({dict(load.created_by_phase)}), "
        f"{len(load.failures)} failed, longest gap between creates "
        f"{load.longest_gap_seconds:.2f}s, {delivered_in_overlap} delivered by {baseline.release} "
        f"on the new schema, provider repeats absorbed {provider.repeats}, webhook repeats "
        f"{receiver.repeats}, old exits {old_exits}"
    )
    assert load.failures == [], load.failures[:10]
    assert old_not_ready == [], old_not_ready[:3]
    # Creates went on in every phase: before, during and after the migration, and on both APIs.
    assert all(load.created_by_phase[p] > 0 for p in ("before", "overlap", "after"))
    assert delivered_in_overlap > 0  # the old worker delivered on the new schema
    assert result.problems == [], result.problems[:10]
    assert result.statuses == {"SENT": len(load.created)}
    assert set(provider.deliveries) == {str(i) for i in load.created}
    assert all(n == 1 for n in provider.deliveries.values())
    assert result.webhook_events == len(load.created) and result.webhooks_missing == 0
    assert all(code in (0, 143, -15) for code in old_exits), old.logs()
