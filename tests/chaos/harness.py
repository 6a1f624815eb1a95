"""Running real worker processes and judging what they left behind.

`WorkerProcesses` starts `python -m notify_queue worker` subprocesses, each in its own process
group so `kill -9` and SIGTERM reach the worker and nothing else, with its log in a file; whatever
is still alive at the end is killed by the fixture that owns it. `audit` reads the database, the
provider and the webhook receiver after a run and counts what the invariants are about: lost
(accepted but not final), stuck (PROCESSING), duplicates (a key answered as a success twice by one
provider, more than the run's faults explain), deliveries that
do not match the database, and webhook events not received. Shared by the tests and by
`scripts/soak.py`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from notify_queue.models import Channel, NewNotification, Priority, Source
from notify_queue.repositories.db import Database
from tests.chaos.peers import ChaosProvider, SignedWebhookReceiver
from tests.support import eventually as poll
from tests.support import notification_service

WEBHOOK_SECRET = "whsec_" + "Y2hhb3MtdGVzdHMtd2ViaG9vay1zZWNyZXQtMzJi"  # base64 of 30 bytes
REPORT_ENV = "NOTIFY_QUEUE_CHAOS_REPORT"
_CHANNELS = [Channel.EMAIL, Channel.SMS, Channel.PUSH]


class WorkerProcesses:
    """Worker subprocesses of one test; `close` kills every process group still alive."""

    def __init__(self, database_url: str, log_dir: Path, *common: str) -> None:
        self.database_url = database_url
        self.log_dir = log_dir
        self.common = list(common)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.apis: list[subprocess.Popen[bytes]] = []
        self.killed = 0
        self._logs: dict[int, Path] = {}

    def start(self, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start one worker with the group's common flags plus `extra`."""
        return self._spawn("worker", [*self.common, *extra], env)

    def start_relay(self, *extra: str) -> subprocess.Popen[bytes]:
        """Start `notify-queue relay` with `extra` flags only (it refuses the workers' flags)."""
        return self._spawn("relay", list(extra), None)

    def start_api(self, port: int, *extra: str) -> subprocess.Popen[bytes]:
        """Start `notify-queue api` on 127.0.0.1:`port` (not counted among `alive` workers)."""
        proc = self._spawn("api", ["--port", str(port), "--log-level", "INFO", *extra], None)
        self.procs.remove(proc)
        self.apis.append(proc)
        return proc

    def _spawn(
        self, role: str, args: list[str], env: dict[str, str] | None
    ) -> subprocess.Popen[bytes]:
        log_path = self.log_dir / f"{role}-{len(self._logs)}.log"
        clean_env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFY_QUEUE_")}
        clean_env.update(env or {})
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "notify_queue",
                    role,
                    "--database-url",
                    self.database_url,
                    *args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=clean_env,
                start_new_session=True,
            )
        self.procs.append(proc)
        self._logs[proc.pid] = log_path
        return proc

    @property
    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def kill9(self, proc: subprocess.Popen[bytes]) -> None:
        _signal_group(proc, signal.SIGKILL)
        proc.wait(timeout=10)
        self.killed += 1

    def terminate(self, proc: subprocess.Popen[bytes]) -> None:
        _signal_group(proc, signal.SIGTERM)

    async def ready(self, *procs: subprocess.Popen[bytes], timeout: float = 30) -> None:
        """Wait until each worker logged that it started (its signal handlers are installed)."""
        for proc in procs or tuple(self.alive):
            await poll(
                lambda p=proc: _async(p.poll() is not None or "worker started" in self.log(p)),
                timeout=timeout,
                interval=0.05,
                what=f"worker {proc.pid} started",
            )
            assert proc.poll() is None, f"worker exited with {proc.returncode}:\n{self.log(proc)}"

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return self._logs[proc.pid].read_text(errors="replace")

    def all_logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self._logs.values())

    def close(self) -> None:
        for proc in self.procs + self.apis:
            if proc.poll() is None:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=10)


async def _async(value: bool) -> bool:
    return value


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def quick_flags(*extra: str) -> list[str]:
    """A worker's flags for one fault test: quick polls, compressed backoff, no recipient limit,
    and nothing else (no --outbound-allow: tests of the trust rule need it absent)."""
    return [
        "--poll-interval",
        "0.2",
        "--backoff-base",
        "0.05",
        "--backoff-max",
        "0.2",
        "--rate-limit",
        "1000000",
        "--log-level",
        "INFO",
        *extra,
    ]


def worker_flags(
    provider: ChaosProvider | None,
    receiver: SignedWebhookReceiver | None = None,
    *,
    lease_seconds: float = 2.0,
    **options: object,
) -> list[str]:
    """The flags of a chaos worker: HTTP provider and signed webhooks on loopback, quick polls,
    a short lease and compressed backoff; `options` add or override (`batch_size=50`)."""
    values: dict[str, object] = {
        "poll_interval": 0.2,
        "lease_seconds": lease_seconds,
        "backoff_base": 0.05,
        "backoff_max": 0.5,
        "rate_limit": 1_000_000,
        "provider_timeout": 5,
        "webhook_timeout": 1,
        "webhook_backoff_base": 0.1,
        "webhook_backoff_max": 0.5,
        "webhook_max_attempts": 30,
        "outbound_allow": "127.0.0.1/32",
        "log_level": "INFO",
        "shutdown_grace_seconds": 1,
    }
    if provider is not None:
        values |= {"provider": "http", "provider_url": provider.url}
    if receiver is not None:
        values |= {"webhook_url": receiver.url, "webhook_secret": receiver.secret}
    values |= options
    flags: list[str] = []
    for name, value in values.items():
        flags += ["--" + name.replace("_", "-"), str(value)]
    return flags


def new_notifications(
    count: int,
    *,
    priority: Priority = Priority.NORMAL,
    webhook_url: str | None = None,
    tag: str = "",
) -> list[NewNotification]:
    """`count` notifications to distinct recipients, channels mixed, due now."""
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    batch = []
    for i in range(count):
        channel = _CHANNELS[i % 3]
        token = uuid.uuid4().hex
        recipient = {
            Channel.EMAIL: f"u-{token[:12]}@example.com",
            Channel.SMS: "+49" + str(int(token[:12], 16))[:12].rjust(12, "1"),
            Channel.PUSH: f"device-{token}",
        }[channel]
        batch.append(
            NewNotification(
                idempotency_key=f"chaos-{tag}-{token}",
                request_hash=token,
                channel=channel,
                recipient=recipient,
                body=f"chaos notification {i}",
                subject="chaos" if channel is Channel.EMAIL else None,
                priority=priority,
                send_at=now,
                webhook_url=webhook_url,
                source=Source.API,
            )
        )
    return batch


async def enqueue(db: Database, notifications: list[NewNotification]) -> list[uuid.UUID]:
    """Enqueue through the same service the API uses, in batches of at most 1,000, with the
    NOTIFY the API sends (idle workers wait for it: they do not poll)."""
    service = notification_service(db)
    ids: list[uuid.UUID] = []
    for start in range(0, len(notifications), 1000):
        results = await service.enqueue_many(notifications[start : start + 1000])
        assert all(r.created for r in results)
        ids += [r.notification.id for r in results]
    return ids


async def counts(db: Database) -> dict[str, int]:
    rows = await db.fetch_all("queue_status_counts")
    return {r["status"]: int(r["n"]) for r in rows}


async def all_final(db: Database, total: int) -> bool:
    c = await counts(db)
    return sum(n for s, n in c.items() if s not in ("PENDING", "PROCESSING")) == total


@dataclass
class Audit:
    """What a run left behind. The invariants hold when every `problem_*` list is empty."""

    notifications: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    provider_calls: int = 0
    deliveries: int = 0
    repeats_absorbed: int = 0
    duplicates: int = 0
    delivered_by_two_providers: int = 0
    lost: int = 0
    stuck: int = 0
    webhook_events: int = 0
    webhooks_received: int = 0
    webhook_repeats: int = 0
    webhooks_missing: int = 0
    bad_signatures: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        data = asdict(self)
        data["problems"] = data["problems"][:10]
        return data


async def audit(
    db: Database,
    ids: Iterable[uuid.UUID],
    provider: ChaosProvider | None = None,
    receiver: SignedWebhookReceiver | None = None,
    *,
    providers: dict[str, ChaosProvider] | None = None,
    two_providers_allowed: bool = False,
    repeats_explained: int = 0,
) -> Audit:
    """Check the invariants of issue #7 over the notifications `ids`:

    - every one is final (none lost, none stuck in PROCESSING, no lease or claim token left);
    - the provider answered each key as a success at most once (every later success is a call
      that would have delivered twice without the key); `repeats_explained` is how many such
      repeat calls the run's faults can explain (`lost_outcomes_bound`), 0 for a run that loses
      no outcome; a SENT notification's key was delivered, with the messageId the database
      recorded; a key that is not SENT was not delivered (a crash during the final re-check may
      dead-letter a delivered one: counted, reported, allowed);
    - every reported status change has its webhook event, received at least once with a valid
      signature, its original eventId and the payload the database holds.

    With `providers` (a providers file's named providers, by name), each provider must have
    delivered each key at most once, a SENT notification's key exactly once at the provider the
    database names, and no key may have been delivered by two providers: under the default
    failover (`OnDefiniteFailure`) a notification whose attempt had an unknown outcome stays with
    that provider (docs/providers.md). `two_providers_allowed`: the run used `Always`, whose
    documented trade-off is exactly such a duplicate; they are then counted, not a problem.
    """
    wanted = list(ids)
    rows = await read_rows(
        db,
        "SELECT id, status, attempt_count, max_attempts, provider_message_id, provider,"
        " claim_token, lease_expires_at FROM nq_all_notifications WHERE id = ANY(%(ids)s::uuid[])",
        {"ids": wanted},
    )
    result = Audit(notifications=len(wanted))
    by_id = {r["id"]: r for r in rows}
    if len(by_id) != len(wanted):
        result.problems.append(f"{len(wanted) - len(by_id)} accepted notifications are missing")
        result.lost += len(wanted) - len(by_id)
    for r in rows:
        result.statuses[r["status"]] = result.statuses.get(r["status"], 0) + 1
        if r["status"] in ("PENDING", "PROCESSING"):
            result.lost += 1
        if (
            r["status"] == "PROCESSING"
            or r["claim_token"] is not None
            or r["lease_expires_at"] is not None
        ):
            result.stuck += 1
            result.problems.append(f"{r['id']} left leased in {r['status']}")
    if result.lost:
        result.problems.append(f"{result.lost} notifications not final: {result.statuses}")
    named = providers or ({} if provider is None else {"": provider})
    if named:
        result.provider_calls = sum(sum(p.calls.values()) for p in named.values())
        result.deliveries = sum(len(p.message_ids) for p in named.values())
        result.repeats_absorbed = sum(p.repeats for p in named.values())
        result.duplicates = sum(p.duplicates() for p in named.values())
        if result.repeats_absorbed > repeats_explained:
            result.problems.append(
                f"{result.duplicates} keys answered twice by one provider: "
                f"{result.repeats_absorbed} repeat calls, {repeats_explained} explained by faults"
            )
        malformed = sum(len(p.malformed) for p in named.values())
        if malformed:
            result.problems.append(f"{malformed} malformed provider requests")
        delivered_but_dead = by_two = 0
        for r in rows:
            key = str(r["id"])
            # Every call is made under a claim, and every claim counts an attempt: a key answered
            # more often than it was claimed was sent twice on one claim.
            answered = sum(p.deliveries[key] for p in named.values())
            if answered > r["attempt_count"]:
                result.problems.append(
                    f"{key} answered {answered} times on {r['attempt_count']} claims"
                )
            delivered_by = [n for n, p in named.items() if p.deliveries[key]]
            by_two += len(delivered_by) > 1
            if r["status"] == "SENT":
                sender = named[r["provider"] if providers else ""]
                if not sender.deliveries[key]:
                    result.problems.append(f"{key} SENT but never delivered")
                elif r["provider_message_id"] != sender.message_ids[key]:
                    result.problems.append(
                        f"{key} records {r['provider_message_id']}, not the delivery's id"
                    )
            elif delivered_by:
                if r["status"] == "DEAD_LETTERED" and r["attempt_count"] > r["max_attempts"]:
                    delivered_but_dead += 1
                else:
                    result.problems.append(f"{key} delivered but {r['status']}")
        result.extra["delivered_but_dead_lettered_after_recheck"] = delivered_but_dead
        result.delivered_by_two_providers = by_two
        if by_two and not two_providers_allowed:
            result.problems.append(f"{by_two} keys delivered by two providers")
    events = await _audit_events(db, wanted)
    result.webhook_events = len(events)
    if receiver is not None:
        result.bad_signatures = receiver.bad_signatures + receiver.mismatched_ids
        if result.bad_signatures:
            result.problems.append(
                f"{result.bad_signatures} webhook posts with a bad signature or id"
            )
        expected_per_id: dict[uuid.UUID, int] = {}
        for r in rows:
            if r["status"] in ("SENT", "FAILED", "DEAD_LETTERED", "EXPIRED"):
                expected_per_id[r["id"]] = expected_per_id.get(r["id"], 0) + 1
        events_per_id: dict[uuid.UUID, int] = {}
        for e in events:
            events_per_id[e["notification_id"]] = events_per_id.get(e["notification_id"], 0) + 1
            got = receiver.events.get(str(e["id"]))
            if not got:
                result.webhooks_missing += 1
                continue
            result.webhooks_received += 1
            stored = json.loads(e["payload"])
            if any(g.payload != stored for g in got):
                result.problems.append(f"event {e['id']} arrived with a payload other than stored")
        result.webhook_repeats = receiver.repeats
        for nid in expected_per_id:
            if events_per_id.get(nid, 0) < 1:
                result.problems.append(f"{nid} is final but has no webhook event")
        if result.webhooks_missing:
            result.problems.append(f"{result.webhooks_missing} webhook events never received")
    return result


def lost_outcomes_bound(*, workers_lost: int, concurrency: int, batch_size: int) -> int:
    """The most repeat calls faults can explain: a worker killed (or cut off from its database)
    forgets at most the rows it claimed and has not recorded, its `concurrency` deliveries plus
    one claimed batch; each may be sent again with the same key once its lease expires."""
    return workers_lost * (concurrency + batch_size)


async def _audit_events(db: Database, ids: list[uuid.UUID]) -> list[dict[str, Any]]:
    return await read_rows(
        db,
        "SELECT id, notification_id, payload, state, attempts FROM nq_webhook_events"
        " WHERE notification_id = ANY(%(ids)s::uuid[])",
        {"ids": ids},
    )


async def read_rows(
    db: Database, query: str, params: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """A test's own read-only query (parameterised), on a connection of its own."""
    async with await psycopg.AsyncConnection.connect(
        db.url, autocommit=True, row_factory=dict_row
    ) as conn:
        cur = await conn.execute(query, params)  # type: ignore[arg-type]
        return list(await cur.fetchall())


def record(name: str, audit_or_data: Audit | dict[str, Any]) -> None:
    """Print the run's counts; also append them to $NOTIFY_QUEUE_CHAOS_REPORT when set."""
    data = audit_or_data.summary() if isinstance(audit_or_data, Audit) else audit_or_data
    line = json.dumps({"test": name, **data}, default=str, sort_keys=True)
    print(line)
    target = os.environ.get(REPORT_ENV)
    if target:
        with open(target, "a", encoding="utf-8") as out:
            out.write(line + "\n")
