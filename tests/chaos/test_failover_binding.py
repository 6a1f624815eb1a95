"""Failover without duplicates: a notification whose attempt at a provider has an unknown outcome
stays with that provider (issue 19, item 5; docs/providers.md "Failover and the cost of a
duplicate"), through real worker processes and two fake HTTP providers on loopback.

An unknown outcome is a timeout, or a worker killed during the call. Either way, when the
provider's circuit is open at the next attempt, the default `OnDefiniteFailure` must not send the
notification to the next provider of the chain (which never saw its key and would deliver it a
second time): it waits for the circuit's probe, with a visible reason, and goes to the same
provider. `Always` keeps its trade-off and goes to the next provider at once.

Negative controls, by hand: with `services/failover.py::providers_to_try` ignoring `sticky`, the
timeout and head-kill cases see B deliver the notification A was called with; with
`Router._bind` returning True without writing, the rebind-kill case sees A called after B.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from notify_queue.models import Failover, Policy, Status
from notify_queue.repositories.db import Database
from notify_queue.repositories.policies import PolicyRepository
from tests.chaos.harness import poll, quick_flags, read_rows
from tests.chaos.test_providers import FakeProvider, _providers_file, _send_wave

LEASE_FLAGS = ("--lease-seconds", "2")


@pytest.fixture
async def pair() -> AsyncIterator[tuple[FakeProvider, FakeProvider]]:
    a, b = await FakeProvider().start(), await FakeProvider().start()
    yield a, b
    a.hang = b.hang = False
    await a.stop()
    await b.stop()


def _file(tmp_path: Path, a: FakeProvider, b: FakeProvider, *, a_timeout: str = "30s") -> str:
    return _providers_file(
        tmp_path,
        [
            {
                "name": "a",
                "type": "http",
                "channels": ["email"],
                "url": a.url,
                "timeout": a_timeout,
                # Open for an hour: a test that needs it closed closes it (`_set_circuit`), so
                # no wait it checks can end on its own before it is seen on a loaded machine.
                "circuitBreaker": {"failures": 1, "openFor": "1h"},
            },
            {"name": "b", "type": "http", "channels": ["email"], "url": b.url, "timeout": "30s"},
        ],
        ["a", "b"],
    )


async def _row(db: Database, id_: uuid.UUID) -> dict[str, Any]:
    [row] = await read_rows(
        db,
        "SELECT status, provider, attempt_count, last_error, delivery_attempts"
        " FROM nq_all_notifications WHERE id = %(id)s",
        {"id": id_},
    )
    return row


async def _final(db: Database, id_: uuid.UUID) -> dict[str, Any] | None:
    row = await _row(db, id_)
    return row if Status(row["status"]).is_final else None


async def _circuit_state(db: Database, name: str) -> str:
    [row] = await read_rows(
        db, "SELECT state FROM nq_provider_circuits WHERE provider = %(p)s", {"p": name}
    )
    return str(row["state"])


async def _set_circuit(db: Database, name: str, *, open_for_seconds: float | None) -> None:
    """Open `name`'s circuit for that long (None: close it), as the breaker itself would. An
    upsert: a worker keeps an existing row at its start (`provider_rows_ensure`), so a circuit set
    before a worker starts is what its first claim sees. (Set while a worker runs, it is seen from
    that worker's next claim on, not by a claim already under way: a race, not a test.)"""
    await read_rows(
        db,
        "INSERT INTO nq_provider_circuits (provider, state, open_until)"
        " SELECT %(p)s, CASE WHEN %(s)s::float8 IS NULL THEN 'closed' ELSE 'open' END,"
        " now() + make_interval(secs => COALESCE(%(s)s, 0))"
        " ON CONFLICT (provider) DO UPDATE SET state = excluded.state,"
        " open_until = excluded.open_until, failures = 0, probe_token = NULL, probe_until = NULL"
        " RETURNING provider",
        {"s": open_for_seconds, "p": name},
    )


async def _due_now(db: Database, id_: uuid.UUID) -> None:
    """A waiting notification's time has come (the test's stand-in for the clock), and the
    workers are woken as every writer of a due row wakes them (else the next look is the safety
    look, 30 s away)."""
    await read_rows(
        db,
        "WITH due AS (UPDATE nq_jobs SET next_attempt_at = now(), waiting_until = now()"
        " WHERE id = %(id)s AND status = 'PENDING' RETURNING id)"
        " SELECT id, pg_notify('nq_wakeup', '') FROM due",
        {"id": id_},
    )


def _keys(provider: FakeProvider) -> set[str]:
    return {key for _, key in provider.arrivals}


async def _waits_for(db: Database, id_: uuid.UUID, name: str) -> dict[str, Any] | None:
    row = await _row(db, id_)
    error = row["last_error"] or ""
    waiting = row["status"] == Status.PENDING and error.startswith(f"waits for provider {name}")
    return row if waiting else None


@pytest.mark.parametrize("failover", [None, "Always"])
async def test_after_a_timeout_an_open_circuit_makes_the_default_wait_for_the_same_provider(
    db: Database,
    database_url: str,
    pair: tuple[FakeProvider, FakeProvider],
    spawn,
    tmp_path: Path,
    failover: str | None,
) -> None:
    a, b = pair
    a.hang = True  # the first call times out: its outcome is unknown
    path = _file(tmp_path, a, b, a_timeout="1s")
    policy = None
    if failover is not None:
        policy = "ns/one-time-codes"
        await _upsert_policy(db, policy, failover)
    procs = spawn(database_url)
    worker = procs.start(*quick_flags("--providers-file", path, "--channels", "email"))
    await procs.ready(worker)
    [id_] = await _send_wave(db, 1, "timeout", policy=policy)
    key = str(id_)
    if failover is None:
        await poll(lambda: _circuit_is(db, "a", "open"), timeout=30, what="A's circuit open")
        a.hang = False  # A answers again, but its circuit stays open for its cool-down
        # While it is open the notification waits for A, and says so; B is never asked. Then
        # the cool-down ends for the circuit and the row alike.
        waiting = await poll(lambda: _waits_for(db, id_, "a"), timeout=60, what="a wait")
        await _set_circuit(db, "a", open_for_seconds=None)
        await _due_now(db, id_)
        row = await poll(lambda: _final(db, id_), timeout=60, what="sent")
        assert key not in _keys(b), "delivered by A's timed-out call, then by B"
        assert row["status"] == Status.SENT and row["provider"] == "a"
        assert {x["provider"] for x in row["delivery_attempts"]} == {"a"}
        assert waiting["status"] == Status.PENDING and waiting["provider"] == "a"
    else:
        # Always: a late duplicate is better than none; B is tried in the same attempt.
        row = await poll(lambda: _final(db, id_), timeout=30, what="sent")
        assert row["status"] == Status.SENT and row["provider"] == "b"
        assert key in _keys(a) and key in _keys(b)
    assert worker.poll() is None


async def _circuit_is(db: Database, name: str, state: str) -> bool:
    return await _circuit_state(db, name) == state


async def _upsert_policy(db: Database, name: str, failover: str) -> None:
    policy = Policy(name=name, failover=Failover(failover))
    await PolicyRepository(db).policy_upsert(policy=policy, ready=True)


@pytest.mark.parametrize("called", ["head", "rebound"])
async def test_a_worker_killed_during_the_call_leaves_the_notification_with_that_provider(
    db: Database,
    database_url: str,
    pair: tuple[FakeProvider, FakeProvider],
    spawn,
    tmp_path: Path,
    called: str,
) -> None:
    """`head`: the claim bound the row to A and the worker dies calling A; then A's circuit is
    open: the recovered notification waits for A. `rebound`: A's circuit was open, so the worker
    bound the row to B before calling B and died there; then A is closed again: the recovered
    notification still goes to B, not back to the head of its chain."""
    a, b = pair
    first, other = (a, b) if called == "head" else (b, a)
    first.hang = True
    path = _file(tmp_path, a, b)
    procs = spawn(database_url)
    flags = quick_flags("--providers-file", path, "--channels", "email", *LEASE_FLAGS)
    if called == "rebound":
        await _set_circuit(db, "a", open_for_seconds=3600)
    doomed = procs.start(*flags)
    await procs.ready(doomed)
    [id_] = await _send_wave(db, 1, f"kill-{called}")
    key = str(id_)
    await poll(lambda: _arrived(first, key), timeout=30, what="the call in progress")
    procs.kill9(doomed)
    first.hang = False
    if called == "head":
        # Open for an hour, so the recovered notification is seen waiting however long the
        # survivor takes to start and the lease to run out on a loaded machine (a 6 s circuit had
        # closed and the row was SENT before the poll looked); then the hour passes for the
        # circuit and the row alike.
        await _set_circuit(db, "a", open_for_seconds=3600)
    else:
        await _set_circuit(db, "a", open_for_seconds=None)
    survivor = procs.start(*flags)
    await procs.ready(survivor)
    waiting = None
    if called == "head":
        waiting = await poll(lambda: _waits_for(db, id_, "a"), timeout=60, what="a wait")
        await _set_circuit(db, "a", open_for_seconds=None)
        await _due_now(db, id_)
    row = await poll(lambda: _final(db, id_), timeout=60, what="sent")
    assert key not in _keys(other), f"{key} was sent to both providers"
    assert row["status"] == Status.SENT
    assert row["provider"] == ("a" if called == "head" else "b")
    if waiting is not None:  # the recovered notification said what it waited for
        assert waiting["status"] == Status.PENDING and waiting["provider"] == "a"
    assert survivor.poll() is None


async def _arrived(provider: FakeProvider, key: str) -> bool:
    return key in _keys(provider)
