#!/usr/bin/env python3
"""The long soak: every fault of tests/chaos at random, for minutes, against one running system.

    .venv/bin/python scripts/soak.py --minutes 10 [--workers 4] [--rate 200] [--seed 1]

It starts its own PostgreSQL (durable settings, so crashes are real), the API and a pool of
worker processes, two HTTP providers in a providers file (a primary that fails 20% of calls, with
a circuit breaker, and a backup it fails over to) and a webhook receiver that checks every
signature (all from tests/chaos/peers.py). A client enqueues notifications through the API at
`--rate` per second while, every few seconds, one fault strikes: a worker killed with `kill -9`,
a worker stopped with SIGTERM, PostgreSQL restarted (fast or as a crash), the receiver down for
a while, the primary flapping (down and up every second or so: its circuit opens, probes,
closes), or an outage of both providers. Then the faults stop, the system drains, and
the invariants of issue #7 are checked over everything the API accepted (tests/chaos/harness.py:
`audit`): none lost, none stuck, no key delivered twice by one provider, and, under the default
failover (`OnDefiniteFailure`), no notification delivered by two providers (issue 19). Prints one
JSON summary line; exits 1 when an invariant was broken.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
from tests.chaos.harness import (  # noqa: E402
    WEBHOOK_SECRET,
    WorkerProcesses,
    audit,
    lost_outcomes_bound,
    read_rows,
    worker_flags,
)
from tests.chaos.peers import ChaosProvider, SignedWebhookReceiver  # noqa: E402
from tests.support import eventually as poll  # noqa: E402
from tests.support import free_port  # noqa: E402

from notify_queue.embedded import EmbeddedPostgres  # noqa: E402
from notify_queue.repositories.db import Database  # noqa: E402
from notify_queue.repositories.schema import migrate  # noqa: E402
from notify_queue.settings import WorkerOptions  # noqa: E402

FAULTS = [
    "kill9",
    "kill9",
    "sigterm",
    "pg_fast",
    "pg_immediate",
    "receiver_down",
    "flap",
    "outage",
]


async def soak(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="nq-soak-"))
    server = EmbeddedPostgres(work / "pg", delete_on_stop=True)
    provider = await ChaosProvider(failure_rate=0.2, latency_seconds=0.005, seed=args.seed).start()
    backup = await ChaosProvider(latency_seconds=0.005, seed=args.seed + 1).start()
    receiver = await SignedWebhookReceiver(WEBHOOK_SECRET).start()
    providers_file = work / "providers.yaml"
    providers_file.write_text(
        json.dumps(  # JSON is YAML
            {
                "providers": [
                    {
                        "name": name,
                        "type": "http",
                        "channels": ["email", "sms", "push", "voice"],
                        "url": p.url,
                        "timeout": "5s",
                        "circuitBreaker": {"failures": 5, "openFor": "2s"},
                    }
                    for name, p in (("primary", provider), ("backup", backup))
                ],
                "chains": {c: ["primary", "backup"] for c in ("email", "sms", "push")},
            }
        )
    )
    url = server.url()
    db = Database(url, pool_size=4)
    await db.open()
    await migrate(db)
    port = free_port()
    flags = [
        *worker_flags(None, receiver, lease_seconds=5, backoff_base=0.2, backoff_max=5),
        "--providers-file",
        str(providers_file),
    ]
    procs = WorkerProcesses(url, work, *flags)
    accepted: dict[str, uuid.UUID] = {}
    unanswered: list[list[dict[str, str]]] = []
    faults: dict[str, int] = {}
    try:
        procs.start_api(port)
        for _ in range(args.workers):
            procs.start()
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as http:
            await poll(lambda: _status_ok(http, f"{base}/readyz"), timeout=60, what="API ready")
            stop = asyncio.Event()
            client = asyncio.create_task(_client(http, base, args.rate, accepted, unanswered, stop))
            deadline = time.monotonic() + args.minutes * 60
            while time.monotonic() < deadline:
                await asyncio.sleep(rng.uniform(2, 6))
                fault = rng.choice(FAULTS)
                faults[fault] = faults.get(fault, 0) + 1
                await _strike(fault, rng, procs, server, (provider, backup), receiver)
                print(
                    f"{time.strftime('%H:%M:%S')} {fault}: accepted {len(accepted)}",
                    file=sys.stderr,
                )
            stop.set()
            await client
            await poll(lambda: _status_ok(http, f"{base}/readyz"), timeout=60, what="API ready")
            for items in unanswered:  # what a client would send again, with the same keys
                await _send(http, base, items, accepted, [])
            ids = list(accepted.values())
            await poll(
                lambda: _final(db, ids),
                timeout=300,
                interval=1,
                what="every accepted notification final",
            )
            # The outages dead-lettered some: the operator retries them all, as after a real one.
            dead_lettered = await _retry_dead_letters(http, base)
        await poll(
            lambda: _final(db, ids),
            timeout=300,
            interval=1,
            what="every retried notification final",
        )
        await poll(
            lambda: _webhooks_settled(db), timeout=300, interval=1, what="webhooks delivered"
        )
        # A kill or SIGTERM may repeat what its worker had claimed and not recorded; a restart
        # of PostgreSQL what every worker had. Nothing else may repeat a call.
        restarts = faults.get("pg_fast", 0) + faults.get("pg_immediate", 0)
        explained = lost_outcomes_bound(
            workers_lost=faults.get("kill9", 0)
            + faults.get("sigterm", 0)
            + restarts * args.workers,
            concurrency=WorkerOptions.model_fields["concurrency"].default,
            batch_size=WorkerOptions.model_fields["batch_size"].default,
        )
        result = await audit(
            db,
            ids,
            receiver=receiver,
            providers={"primary": provider, "backup": backup},
            repeats_explained=explained,
        )
        result.extra |= {
            "minutes": args.minutes,
            "faults": faults,
            "worker_kills": procs.killed,
            "operator_retried": dead_lettered,
        }
        print(json.dumps(result.summary(), default=str, sort_keys=True))
        return 1 if result.problems else 0
    finally:
        procs.close()
        await db.close()
        await provider.stop()
        await backup.stop()
        await receiver.stop()
        server.stop()


async def _strike(
    fault: str,
    rng: random.Random,
    procs: WorkerProcesses,
    server: EmbeddedPostgres,
    providers: tuple[ChaosProvider, ChaosProvider],
    receiver: SignedWebhookReceiver,
) -> None:
    if fault in ("kill9", "sigterm"):
        victim = rng.choice(procs.alive)
        if fault == "kill9":
            await asyncio.to_thread(procs.kill9, victim)
        else:
            await procs.ready(victim)
            procs.terminate(victim)
            await asyncio.to_thread(victim.wait, 30)
        procs.start()
    elif fault.startswith("pg_"):
        await asyncio.to_thread(server.halt, mode=fault.removeprefix("pg_"))
        await asyncio.sleep(rng.uniform(1, 5))
        await asyncio.to_thread(server.resume)
    elif fault == "receiver_down":
        await receiver.go_down()
        await asyncio.sleep(rng.uniform(2, 10))
        await receiver.come_back()
    elif fault == "flap":
        primary = providers[0]
        for _ in range(rng.randint(3, 8)):
            primary.outage = not primary.outage
            await asyncio.sleep(rng.uniform(0.5, 2))
        primary.outage = False
    elif fault == "outage":
        for p in providers:
            p.outage = True
        await asyncio.sleep(rng.uniform(2, 10))
        for p in providers:
            p.outage = False


async def _client(
    http: aiohttp.ClientSession,
    base: str,
    rate: int,
    accepted: dict[str, uuid.UUID],
    unanswered: list[list[dict[str, str]]],
    stop: asyncio.Event,
) -> None:
    per_batch = max(1, rate // 10)
    while not stop.is_set():
        started = time.monotonic()
        items = [_item() for _ in range(per_batch)]
        await _send(http, base, items, accepted, unanswered)
        await asyncio.sleep(max(0.1 - (time.monotonic() - started), 0))


def _item() -> dict[str, str]:
    token = uuid.uuid4().hex
    return {
        "idempotencyKey": f"soak-{token}",
        "channel": "email",
        "recipient": f"s-{token[:12]}@example.com",
        "body": "soak",
    }


async def _send(
    http: aiohttp.ClientSession,
    base: str,
    items: list[dict[str, str]],
    accepted: dict[str, uuid.UUID],
    unanswered: list[list[dict[str, str]]],
) -> None:
    try:
        async with http.post(f"{base}/notifications/batch", json={"notifications": items}) as r:
            if r.status != 200:
                unanswered.append(items)
                return
            body = await r.json()
    except (aiohttp.ClientError, TimeoutError):
        unanswered.append(items)
        return
    for item, result in zip(items, body["results"], strict=True):
        if result["status"] in (200, 201):
            accepted[item["idempotencyKey"]] = uuid.UUID(result["notification"]["id"])


async def _retry_dead_letters(http: aiohttp.ClientSession, base: str) -> int:
    total = 0
    while True:
        async with http.post(f"{base}/notifications/retry", json={"status": "DEAD_LETTERED"}) as r:
            body = await r.json()
        retried: int = body["retried"]
        total += retried
        if body["remaining"] == 0:
            return total


async def _status_ok(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url) as r:
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def _final(db: Database, ids: list[uuid.UUID]) -> bool:
    try:
        rows = await read_rows(
            db,
            "SELECT count(*) AS n FROM nq_all_notifications WHERE id = ANY(%(ids)s::uuid[])"
            " AND status NOT IN ('PENDING', 'PROCESSING')",
            {"ids": ids},
        )
    except Exception:
        return False
    final: int = rows[0]["n"]
    return final == len(ids)


async def _webhooks_settled(db: Database) -> bool:
    rows = await read_rows(
        db, "SELECT count(*) AS n FROM nq_webhook_events WHERE state <> 'delivered'"
    )
    unsettled: int = rows[0]["n"]
    return unsettled == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long faults strike [10]")
    parser.add_argument("--workers", type=int, default=4, help="worker processes [4]")
    parser.add_argument(
        "--rate", type=int, default=200, help="notifications enqueued per second [200]"
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the fault schedule [1]")
    return asyncio.run(soak(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
