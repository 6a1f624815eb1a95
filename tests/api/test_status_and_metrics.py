"""GET /status and GET /metrics: the queue's figures read from the database (counts per status,
due per priority, the oldest due age, webhook events), the same in both, and equal to what a
direct SQL count says; the database engine (plain PostgreSQL here, Citus in tests/citus); the
process's own figures on /metrics (creates by outcome, its database pool); and /healthz and
/readyz.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from notify_queue.embedded import EmbeddedPostgres
from notify_queue.models import Status
from notify_queue.repositories.schema import latest_version
from tests.api.support import PROBLEM, api_client, email, sql
from tests.support import set_status_sql


async def fill_queue(client: httpx.AsyncClient, database_url: str) -> None:
    """A queue with something in every status, three lanes due, some future, webhook events."""
    lanes = ("HIGH", "NORMAL", "LOW")
    past = "2020-01-01T00:00:00Z"
    items = [email(idempotencyKey=f"n-{i}", priority=lanes[i % 3], sendAt=past) for i in range(30)]
    items += [email(idempotencyKey=f"later-{i}", delaySeconds=3600) for i in range(4)]
    assert (
        await client.post("/notifications/batch", json={"notifications": items})
    ).status_code == 200
    for i, status in enumerate(
        ["PROCESSING", "SENT", "SENT", "FAILED", "DEAD_LETTERED", "CANCELLED", "EXPIRED"]
    ):
        await sql(
            database_url,
            set_status_sql("idempotency_key = %(key)s"),
            {"status": status, "key": f"n-{i}"},
        )
    for state, count in (("pending", 2), ("delivered", 5), ("failed", 1)):
        for _ in range(count):
            await sql(
                database_url,
                "WITH e AS (INSERT INTO nq_webhook_events (id, notification_id, url, payload,"
                " state) VALUES (%s, %s, 'http://hooks.example/x', '{}', %s) RETURNING state)"
                " SELECT nq_count('webhooks', NULL, array_agg(state), '{pending}') FROM e",
                [uuid.uuid4(), uuid.uuid4(), state],
            )


async def database_figures(database_url: str) -> dict[str, dict[str, float]]:
    counts = dict(
        await sql(database_url, "SELECT status, count(*) FROM nq_all_notifications GROUP BY status")
    )
    due = await sql(
        database_url,
        "SELECT priority, count(*) FROM nq_all_notifications"
        " WHERE status = 'PENDING' AND next_attempt_at <= now() GROUP BY priority",
    )
    ((oldest,),) = await sql(
        database_url,
        "SELECT extract(epoch FROM now() - min(next_attempt_at))::float FROM nq_all_notifications"
        " WHERE status = 'PENDING' AND next_attempt_at <= now()",
    )
    hooks = dict(
        await sql(database_url, "SELECT state, count(*) FROM nq_webhook_events GROUP BY state")
    )
    names = {0: "HIGH", 1: "NORMAL", 2: "LOW"}
    return {
        "counts": {s.value: counts.get(s.value, 0) for s in Status},
        "due": {names[p]: n for p, n in due},
        "oldest": {"age": oldest},
        "hooks": dict(hooks),
    }


async def test_status_reports_the_databases_counts(
    client: httpx.AsyncClient, database_url: str
) -> None:
    await fill_queue(client, database_url)
    expected = await database_figures(database_url)

    response = await client.get("/status")

    assert response.status_code == 200
    status = response.json()
    assert set(status) == {"counts", "due", "oldestDueAgeSeconds", "database", "providers"}
    assert status["providers"] == {}  # no provider with a breaker has run
    assert status["counts"] == expected["counts"]
    assert status["due"] == expected["due"] == {"HIGH": 7, "NORMAL": 8, "LOW": 8}
    assert status["oldestDueAgeSeconds"] == pytest.approx(expected["oldest"]["age"], abs=5)
    assert status["database"] == {"engine": "postgresql", "workerNodes": 0}


async def test_an_empty_queue_has_zero_everywhere(client: httpx.AsyncClient) -> None:
    status = (await client.get("/status")).json()
    assert set(status["counts"].values()) == {0} and set(status["due"].values()) == {0}
    assert status["oldestDueAgeSeconds"] == 0


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


async def test_metrics_equal_the_databases_figures(
    client: httpx.AsyncClient, database_url: str
) -> None:
    await fill_queue(client, database_url)
    expected = await database_figures(database_url)

    response = await client.get("/metrics")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    found = samples(response.text)
    for status, count in expected["counts"].items():
        assert found[("notify_queue_notifications", (("status", status),))] == count
    for priority, count in expected["due"].items():
        assert found[("notify_queue_queue_depth", (("priority", priority),))] == count
    for state, count in expected["hooks"].items():
        assert found[("notify_queue_webhook_events", (("state", state),))] == count
    assert found[("notify_queue_oldest_due_age_seconds", ())] == pytest.approx(
        expected["oldest"]["age"], abs=5
    )
    assert expected["oldest"]["age"] > 1000  # sendAt 2020: the figure is real, not a default
    lanes = {
        priority: found[("notify_queue_queue_oldest_due_age_seconds", (("priority", priority),))]
        for priority in ("HIGH", "NORMAL", "LOW")
    }
    # Every lane has notifications due since 2020; the global figure is the lanes' maximum.
    assert min(lanes.values()) > 1000
    assert max(lanes.values()) == found[("notify_queue_oldest_due_age_seconds", ())]


async def test_metrics_count_creates_by_outcome(client: httpx.AsyncClient) -> None:
    one = email(idempotencyKey="c-1")
    assert (await client.post("/notifications", json=one)).status_code == 201
    assert (await client.post("/notifications", json=one)).status_code == 200
    other = email(idempotencyKey="c-1", body="another")
    assert (await client.post("/notifications", json=other)).status_code == 409
    assert (await client.post("/notifications", json={"channel": "fax"})).status_code == 400
    batch = [email(idempotencyKey="c-2"), email(idempotencyKey="c-1"), {"channel": "fax"}]
    answer = await client.post("/notifications/batch", json={"notifications": batch})
    assert [r["status"] for r in answer.json()["results"]] == [201, 200, 400]

    found = samples((await client.get("/metrics")).text)

    counted = {
        outcome: found[("notify_queue_creates_total", (("outcome", outcome),))]
        for outcome in ("created", "existing", "conflict", "invalid")
    }
    assert counted == {"created": 2, "existing": 2, "conflict": 1, "invalid": 2}


async def test_metrics_report_the_processs_database_pool(client: httpx.AsyncClient) -> None:
    found = samples((await client.get("/metrics")).text)

    in_use = found[("notify_queue_database_pool_connections", (("state", "in_use"),))]
    idle = found[("notify_queue_database_pool_connections", (("state", "idle"),))]
    limit = found[("notify_queue_database_pool_max_connections", ())]
    assert 0 <= in_use + idle <= limit and limit >= 1
    assert found[("notify_queue_database_pool_acquires_total", ())] >= 1  # this scrape's status
    assert found[("notify_queue_database_pool_waiting", ())] >= 0
    assert ("notify_queue_database_pool_acquire_wait_seconds_total", ()) in found


async def test_metrics_include_the_standard_process_metrics(client: httpx.AsyncClient) -> None:
    names = {
        family.name
        for family in text_string_to_metric_families((await client.get("/metrics")).text)
    }
    assert {"process_cpu_seconds", "process_resident_memory_bytes", "python_info"} <= names


async def test_metrics_speak_openmetrics_when_asked(client: httpx.AsyncClient) -> None:
    response = await client.get(
        "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.rstrip().endswith("# EOF")


async def test_two_apps_in_one_process_keep_separate_registries(
    client: httpx.AsyncClient, database_url: str
) -> None:
    async with api_client(database_url) as other:
        first, second = await client.get("/metrics"), await other.get("/metrics")
    assert first.status_code == second.status_code == 200


async def test_healthz_answers_without_the_database(client: httpx.AsyncClient) -> None:
    response = await client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


async def test_readyz_is_200_when_the_schema_is_current(client: httpx.AsyncClient) -> None:
    response = await client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ready", "schemaVersion": latest_version()}


async def test_readyz_stays_200_once_a_newer_release_has_migrated(
    client: httpx.AsyncClient, database_url: str
) -> None:
    # The next release's pre-upgrade hook has applied a step this code does not know: this
    # release's pods must stay in service until they are replaced (docs/upgrading.md).
    await sql(
        database_url,
        "INSERT INTO nq_schema_steps (version, name, phase, release)"
        " VALUES (9999, 'next_release', 'expand', '99.0.0')",
    )
    response = await client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ready", "schemaVersion": 9999}


async def test_readyz_is_503_when_a_step_this_release_needs_is_missing(
    client: httpx.AsyncClient, database_url: str
) -> None:
    await sql(database_url, "DELETE FROM nq_schema_migrations WHERE version = 8")
    response = await client.get("/readyz")
    assert response.status_code == 503
    assert "lacks 0008_release_0_1_0" in response.json()["detail"]


@pytest.fixture
def unmigrated_database_url(pg_server: EmbeddedPostgres) -> Iterator[str]:
    name = f"bare_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield pg_server.url(name)
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


async def test_readyz_is_503_when_the_schema_is_missing_or_old(
    unmigrated_database_url: str,
) -> None:
    async with api_client(unmigrated_database_url) as http:
        missing = await http.get("/readyz")
        assert missing.status_code == 503 and missing.headers["content-type"] == PROBLEM
        assert "migrate" in missing.json()["detail"]
        await sql(
            unmigrated_database_url,
            "CREATE TABLE nq_schema_migrations (version integer, name text)",
        )
        await sql(unmigrated_database_url, "INSERT INTO nq_schema_migrations VALUES (1, 'initial')")
        old = await http.get("/readyz")
        assert old.status_code == 503 and "lacks 0008_release_0_1_0" in old.json()["detail"]
