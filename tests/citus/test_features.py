"""Digests and escalations on the real Citus cluster (issues 21 and 22: "the Citus tests cover a
digest and an escalation"; docs/scaling.md "Digests and escalations on Citus").

Through the real API and a `notify-queue worker` process against the coordinator, with an HTTP
provider that records each call:
- digests: a batch of three items under one key (one digest), one of them cancelled while the
  digest is open (its carrier: another item takes over); a digest whose only item is cancelled
  (nothing is sent); a digest filled to maxItems by its batch (closed at once); one opened by
  the SQL function notify_queue_enqueue. Each digest that sends is one provider call carrying
  its items, every item left is SENT;
- an escalation (push now, sms after 30 s): the first step SENT, the acknowledgement cancels the
  later one (`acknowledged`), GET shows it, a second acknowledgement answers the same;
- the digest's row and its items, the escalation's row and its steps, live on one shard.

The worker starts only once the digests are created and the cancels done: until a claim closes
it, a digest stays open whatever its window, so the cancels meet an open digest on any machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.citus.cluster import CitusCluster
from tests.citus.test_layout import migrate
from tests.digests.test_processes import CountingProvider
from tests.support import eventually, running_api

pytestmark = pytest.mark.citus


@contextlib.contextmanager
def worker(url: str, provider: str, log: Path) -> Iterator[None]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFY_QUEUE_")}
    command = [sys.executable, "-m", "notify_queue", "worker", "--database-url", url]
    command += ["--provider", "http", "--provider-url", provider, "--rate-limit", "1000"]
    command += ["--poll-interval", "0.2", "--log-level", "WARNING"]
    out = log.open("wb")
    process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        out.close()


def item(recipient: str, key: str, body: str, **digest: Any) -> dict[str, Any]:
    return {
        "channel": "email",
        "recipient": recipient,
        "subject": f"{body} liked your post",
        "body": body,
        "idempotencyKey": uuid.uuid4().hex,
        "digest": {"key": key, "windowSeconds": 1, **digest},
    }


async def batch(http: httpx.AsyncClient, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    response = await http.post("/notifications/batch", json={"notifications": items})
    assert response.status_code in (200, 201, 207), response.text
    results = response.json()["results"]
    assert [r["status"] for r in results] == [201] * len(items), results
    return [r["notification"] for r in results]


def shards(url: str, rows: list[tuple[str, int]]) -> set[tuple[int, int]]:
    """(node port, shard's first hash value) of each (table, bucket): co-located shards of one
    bucket share both; different tables' shards of one bucket differ only in their ids."""
    with psycopg.connect(url) as conn:
        found = set()
        for table, bucket in rows:
            found.add(
                conn.execute(
                    """
                    SELECT n.nodeport, s.shardminvalue::bigint
                    FROM pg_dist_shard s
                    JOIN pg_dist_placement p USING (shardid)
                    JOIN pg_dist_node n USING (groupid)
                    WHERE s.shardid = get_shard_id_for_distribution_column(%s, %s)
                    """,
                    (table, bucket),
                ).fetchone()
            )
    return found


def rows(url: str, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(query, args).fetchall()


async def test_a_digest_and_an_escalation_on_citus(
    citus_cluster: CitusCluster, citus_database: str, tmp_path: Path
) -> None:
    url = citus_database
    migrate(url)
    headers = {"Authorization": "Bearer t"}
    provider = await CountingProvider().start()
    try:
        async with (
            running_api(url, tmp_path / "api.log", "--api-token", "t") as base,
            httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as http,
        ):
            # Digests, created and cancelled before any worker runs.
            likes = await batch(http, [item("ana@example.com", "likes", b) for b in "abc"])
            digest = likes[0]["digest"]["id"]
            assert {n["digest"]["id"] for n in likes} == {digest}
            assert likes[-1]["digest"]["count"] == 3
            assert {n["waiting"]["reason"] for n in likes} == {"DigestWindow"}
            # The carrier (the first item) leaves: the next oldest takes over.
            left = await http.post(f"/notifications/{likes[0]['id']}/cancel")
            assert (left.status_code, left.json()["status"]) == (200, "CANCELLED"), left.text
            assert (await http.get(f"/notifications/{likes[1]['id']}")).json()["digest"][
                "count"
            ] == 2
            (solo,) = await batch(http, [item("bo@example.com", "solo", "x")])
            gone = await http.post(f"/notifications/{solo['id']}/cancel")
            assert (gone.status_code, gone.json()["status"]) == (200, "CANCELLED"), gone.text
            full = await batch(http, [item("cy@example.com", "full", b, maxItems=2) for b in "de"])
            assert full[0]["digest"]["id"] == full[1]["digest"]["id"]
            # The SQL function (0016) opens a digest too, in the caller's transaction.
            with psycopg.connect(url) as conn:
                (enqueued,) = conn.execute(
                    "SELECT notify_queue_enqueue(%s::jsonb, NULL)",
                    (json.dumps(item("di@example.com", "sql", "f")),),
                ).fetchone()
            assert enqueued["digest"]["count"] == 1

            # An escalation: push now, sms after an hour: the second step must still be waiting
            # when the acknowledgement comes (with 30 s, a loaded machine took longer than that to
            # send the digests, the step was claimed first, and the answer showed it PROCESSING).
            user = "u-oncall"
            profile = {"email": "oncall@example.com", "phone": "+4915112345678"}
            put = await http.put(f"/recipients/{user}", json={**profile, "pushTokens": ["dev-1"]})
            assert put.status_code == 201, put.text
            created = await http.post(
                "/notifications",
                json={
                    "recipientId": user,
                    "body": "disk full on db-1",
                    "escalation": {
                        "steps": [{"channel": "push"}, {"channel": "sms", "afterSeconds": 3600}]
                    },
                },
                headers={"Idempotency-Key": "esc-1"},
            )
            assert created.status_code == 201, created.text
            escalation = created.json()["escalation"]["id"]
            first, second = (n["id"] for n in created.json()["notifications"])

            with worker(url, provider.url, tmp_path / "worker.log"):

                async def status(id: str) -> str:
                    return str((await http.get(f"/notifications/{id}")).json()["status"])

                async def sent() -> bool:
                    ids = [n["id"] for n in likes[1:] + full + [enqueued]] + [first]
                    return all([await status(i) == "SENT" for i in ids])

                await eventually(sent, timeout=60, what="the digests' items and step 0 SENT")

                acked = await http.post(
                    f"/escalations/{escalation}/acknowledge", json={"by": "ana"}
                )
                assert acked.status_code == 200, acked.text
                answer = acked.json()
                assert (answer["state"], answer["acknowledgedBy"]) == ("acknowledged", "ana")
                steps = {n["id"]: n for n in answer["notifications"]}
                assert steps[first]["status"] == "SENT"
                assert (steps[second]["status"], steps[second]["lastError"]) == (
                    "CANCELLED",
                    "acknowledged",
                )
                again = await http.post(f"/escalations/{escalation}/acknowledge")
                assert (again.status_code, again.json()) == (200, answer)
                read = await http.get(f"/escalations/{escalation}")
                assert (read.status_code, read.json()) == (200, answer)
    finally:
        await provider.stop()

    # One provider call per digest that sent (its key: the digest's id), carrying its items.
    calls = Counter(c["key"] for c in provider.calls)
    full_digest = full[0]["digest"]["id"]
    sql_digest = enqueued["digest"]["id"]
    digest_calls = {
        k: n for k, n in calls.items() if k in (digest, full_digest, sql_digest, solo["id"])
    }
    assert digest_calls == {digest: 1, full_digest: 1, sql_digest: 1}
    assert len(provider.calls) == 4  # the three digests and the escalation's first step
    by_key = {c["key"]: c for c in provider.calls}
    assert by_key[digest]["metadata"]["digest"]["count"] == 2
    assert sorted(by_key[digest]["body"].split("\n")) == ["b", "c"]
    assert rows(
        url,
        "SELECT key, state, item_count FROM nq_digests ORDER BY key",
    ) == [
        ("full", "closed", 2),
        ("likes", "closed", 2),
        ("solo", "cancelled", 0),
        ("sql", "closed", 1),
    ]
    assert dict(rows(url, "SELECT status, count(*) FROM nq_all_notifications GROUP BY 1")) == {
        "SENT": 6,  # likes b, c; full d, e; sql f; the escalation's push
        "CANCELLED": 3,  # likes a, solo, the escalation's sms
    }

    # Co-location: each digest and its items, the escalation and its steps, on one shard.
    for id in (digest, full_digest):
        (bucket,) = rows(url, "SELECT bucket FROM nq_digests WHERE id = %s", id)[0]
        items = rows(url, "SELECT bucket FROM nq_all_notifications WHERE digest_id = %s", id)
        assert len(items) >= 2 and {b for (b,) in items} == {bucket}
        tables = ["nq_digests", "nq_jobs", "nq_delivery_log"]
        assert len(shards(url, [(t, bucket) for t in tables])) == 1
    (bucket, step_ids) = rows(
        url, "SELECT bucket, step_ids::text[] FROM nq_escalations WHERE id = %s", escalation
    )[0]
    assert step_ids == [first, second]
    step_buckets = rows(
        url, "SELECT bucket FROM nq_all_notifications WHERE escalation_id = %s", escalation
    )
    assert {b for (b,) in step_buckets} == {bucket} and len(step_buckets) == 2
    tables = ["nq_escalations", "nq_jobs", "nq_delivery_log"]
    assert len(shards(url, [(t, bucket) for t in tables])) == 1
