"""notify_queue.client.Client and AsyncClient against a real `notify-queue api` process, and
their types and operations checked against the OpenAPI document (a drift fails here)."""

from __future__ import annotations

import inspect
import re
import uuid
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from notify_queue.client import ApiError, AsyncClient, Client
from notify_queue.client.http import Call, Calls
from notify_queue.client.types import CHECKED
from tests.support import running_api

TOKEN = "client-test-token"
PENDING_ELSEWHERE: set[str] = set()  # operations the API does not serve yet: none


def _calls() -> dict[str, Call]:
    """One Call of each operation, with placeholder arguments."""
    made: dict[str, Call] = {}
    for name, function in inspect.getmembers(Calls, inspect.isfunction):
        arguments: list[Any] = []
        for p in inspect.signature(function).parameters.values():
            if p.kind is p.KEYWORD_ONLY or p.default is not p.empty:
                continue
            arguments.append({} if p.name in ("fields", "channels") else [] if p.name == "items"
                             else "ID")  # fmt: skip
        made[name] = function(*arguments)
    return made


async def test_every_operation_of_the_client_is_one_of_the_openapi_document(
    database_url: str, tmp_path: Path
) -> None:
    async with running_api(database_url, tmp_path / "api.log") as url:
        async with AsyncClient(url) as api:
            document = await api.send(Call("getOpenApi", "GET", "/openapi.json"))
    operations = {
        op["operationId"]: (method.upper(), path)
        for path, item in document["paths"].items()
        for method, op in item.items()
        if isinstance(op, dict) and "operationId" in op
    }
    for name, call in _calls().items():
        if call.operation_id not in operations:
            assert call.operation_id in PENDING_ELSEWHERE, f"{name}: {call.operation_id}"
            continue
        method, template = operations[call.operation_id]
        pattern = re.sub(r"\{[^}]+\}", "[^/]+", template)
        assert call.method == method, name
        assert re.fullmatch(pattern, call.path), f"{name}: {call.path} is not {template}"
    schemas = document["components"]["schemas"]
    for name, typed in CHECKED.items():
        assert name in schemas, f"no component {name} in the document"
        assert set(get_type_hints(typed)) == set(schemas[name]["properties"]), name


async def test_the_async_client_creates_reads_lists_cancels_and_manages_recipients(
    database_url: str, tmp_path: Path
) -> None:
    async with running_api(database_url, tmp_path / "api.log", "--api-token", TOKEN) as url:
        async with AsyncClient(url, TOKEN) as api:
            made = await api.create(
                idempotency_key="c-1", channel="email", recipient="a@example.com", body="hi",
                delay_seconds=3600,
            )  # fmt: skip
            assert "id" in made and made["status"] == "PENDING"
            assert (await api.get(made["id"]))["id"] == made["id"]
            page = await api.list(status="PENDING", limit=10)
            assert [n["id"] for n in page["items"]] == [made["id"]]
            assert (await api.cancel(made["id"]))["status"] == "CANCELLED"
            with pytest.raises(ApiError) as conflict:
                await api.retry(made["id"])
            assert conflict.value.status == 409
            with pytest.raises(ApiError) as invalid:
                await api.create(idempotency_key="c-2", channel="fax", recipient="x", body="b")
            assert invalid.value.status == 400
            assert invalid.value.problem["errors"][0]["field"] == "channel"
            batch = await api.create_batch(
                [{"idempotency_key": "b-1", "channel": "sms", "recipient": "+4915112345678",
                  "body": "x"}]
            )  # fmt: skip
            assert [r["status"] for r in batch["results"]] == [201]
            await api.put_recipient("u1", email="u1@example.com", timezone="UTC")
            assert (await api.get_recipient("u1"))["email"] == "u1@example.com"
            targeted = await api.create(idempotency_key="c-3", recipient_id="u1", body="hi")
            assert "notifications" in targeted
            await api.put_template("receipt", {"email": {"subject": "S", "body": "{{ x }}"}})
            assert (await api.get_template("receipt"))["version"] == 1
            await api.delete_template("receipt")
            await api.delete_recipient("u1")
            assert (await api.retry_many("FAILED", 10))["retried"] == 0
            assert (await api.status())["counts"]["CANCELLED"] == 1
            with pytest.raises(ApiError) as missing:
                await api.get_escalation(uuid.uuid4())
            assert missing.value.status == 404


async def test_the_sync_client_speaks_the_same_api_with_its_token(
    database_url: str, tmp_path: Path
) -> None:
    async with running_api(database_url, tmp_path / "api.log", "--api-token", TOKEN) as url:
        with Client(url, TOKEN) as api:
            made = api.create(idempotency_key="s-1", channel="push", recipient="token-1", body="hi")
            assert api.get(made["id"])["recipient"] == "token-1"
            # Escalations: created by create, then acknowledged and read (CONTRACT section 10).
            api.put_recipient("oncall", phone="+4915112345678", push_tokens=["t-1"])
            steps = [{"channel": "push"}, {"channel": "voice", "afterSeconds": 600}]
            paged = api.create(
                idempotency_key="s-2", recipient_id="oncall", body="db down",
                escalation={"steps": steps},
            )  # fmt: skip
            assert "escalation" in paged
            escalation_id = paged["escalation"]["id"]
            acked = api.acknowledge_escalation(escalation_id, by="ana")
            assert acked["state"] == "acknowledged" and acked["acknowledgedBy"] == "ana"
            assert api.get_escalation(escalation_id)["notifications"][1]["status"] == "CANCELLED"
        with Client(url, "wrong") as stranger, pytest.raises(ApiError) as denied:
            stranger.status()
        assert denied.value.status == 401
