"""The API and notify_queue_enqueue judge every request alike: the shared case table
(tests/enqueue/cases.py) through both doors, comparing field and message of every error."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from tests.api.support import api_client
from tests.enqueue.cases import CASES, KEY_FIELD, KEY_MESSAGES
from tests.enqueue.support import function_errors


def _as_function_names(errors: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [
        {
            "field": KEY_FIELD.get(e["field"], e["field"]),
            "message": KEY_MESSAGES.get(e["message"], e["message"]),
        }
        for e in errors
    ]


async def _api_errors(http: httpx.AsyncClient, body: Any, key: str | None) -> Any:
    headers = {"Idempotency-Key": key} if key is not None else {}
    response = await http.post("/notifications", json=body, headers=headers)
    if response.status_code == 201:
        return None
    assert response.status_code == 400, response.text
    return _as_function_names(response.json()["errors"])


def _unique(body: Any, key: str | None) -> tuple[Any, str | None]:
    """Fresh keys for each door, so the valid cases create instead of repeating."""
    suffix = uuid.uuid4().hex[:8]
    if isinstance(body, dict) and body.get("idempotencyKey") == "body-key":
        body = {**body, "idempotencyKey": f"body-key-{suffix}"}
    if key == "k":
        key = f"k-{suffix}"
    return body, key


async def test_the_api_and_the_function_name_the_same_fields_and_messages(
    database_url: str,
) -> None:
    # One app and one database for the whole table: each case uses fresh keys.
    mismatches = []
    async with api_client(database_url) as http:
        for name, body, key in CASES:
            api = await _api_errors(http, *_unique(body, key))
            sql = function_errors(database_url, *_unique(body, key))
            if sql != api:
                mismatches.append(f"{name}: API {api} but function {sql}")
    assert not mismatches, "\n".join(mismatches)


def test_the_case_table_has_valid_and_invalid_cases() -> None:
    names = [name for name, _, _ in CASES]
    assert len(names) == len(set(names))
    assert sum(name.startswith("valid") for name in names) >= 4
