"""The operator's read of escalations for status.escalation (`kube_escalation_states`) on Citus:
by (bucket, id) on the steps' shard, the state as the API reads it, before and after an
acknowledgement; the escalations are made through a real `notify-queue api` on the
coordinator."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import psycopg

from notify_queue.repositories.db import Database
from tests.citus.test_layout import migrate
from tests.support import running_api

STEPS = [{"channel": "push"}, {"channel": "sms", "afterSeconds": 300}]


async def test_the_operators_escalation_read_routes_to_the_steps_shard(
    citus_database: str, tmp_path: Path
) -> None:
    migrate(citus_database)
    headers = {"Authorization": "Bearer t"}
    async with running_api(citus_database, tmp_path / "api.log", "--api-token", "t") as base:
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as http:
            made = []
            for user in ("ana", "ben", "cem"):
                # Inserted directly: PUT /recipients answers 500 on Citus today (its upsert's
                # `updated_at = now()` in DO UPDATE SET; a separate issue).
                with psycopg.connect(citus_database, autocommit=True) as conn:
                    conn.execute(
                        "INSERT INTO nq_recipients (id, phone, push_tokens)"
                        " VALUES (%s, '+4915112345678', ARRAY['d'])",
                        (user,),
                    )
                created = await http.post(
                    "/notifications",
                    headers={"Idempotency-Key": f"page-{user}"},
                    json={"recipientId": user, "body": "db-1", "escalation": {"steps": STEPS}},
                )
                assert created.status_code == 201, created.text
                made.append((user, uuid.UUID(created.json()["escalation"]["id"])))

            async def states() -> dict[uuid.UUID, tuple[str, int]]:
                async with Database(citus_database, pool_size=1) as db:
                    rows = await db.fetch_all(
                        "kube_escalation_states",
                        {"recipient_ids": [u for u, _ in made], "ids": [i for _, i in made]},
                    )
                return {r["id"]: (r["state"], len(r["step_ids"])) for r in rows}

            assert await states() == {i: ("active", 2) for _, i in made}
            # Marked directly: POST /escalations/{id}/acknowledge answers 500 on Citus today (its
            # lock, `FOR UPDATE` by id alone, is a multi-shard FOR UPDATE; a separate issue).
            with psycopg.connect(citus_database, autocommit=True) as conn:
                conn.execute(
                    "UPDATE nq_escalations SET acknowledged_at = now(), acknowledged_by = 'x'"
                    " WHERE bucket = nq_bucket(%s) AND id = %s",
                    made[1],
                )
            after = await states()
    assert after == {
        made[0][1]: ("active", 2),
        made[1][1]: ("acknowledged", 2),
        made[2][1]: ("active", 2),
    }
