"""Enqueue in the caller's own transaction: `notify_queue_enqueue(request, idempotency_key)`.

Fields are the body of `POST /notifications`, given as keyword arguments in snake_case
(`send_at`, `recipient_id`, `webhook_url`) or in the API's camelCase (`sendAt`): snake_case is
turned into camelCase, camelCase passes as it is. `idempotency_key` is required (as the API's
header is). Datetimes become RFC 3339 text, enums their value. The answer is the API's: the
notification as a dict, or `{"notifications": [...]}` for a `recipient_id` request.

Errors are the API's, translated once here: an invalid request raises `ValidationFailed` with
every bad field (SQLSTATE 22023), the key reused with another request `Conflict` (23505); both
abort the caller's transaction, as any failed statement does (wrap the call in
`conn.transaction()` to keep the rest: a savepoint).
"""

from __future__ import annotations

import enum
import json
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from notify_queue.errors import Conflict, FieldError, ValidationFailed

_STATEMENT = "SELECT notify_queue_enqueue(%s, %s)"


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _value(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("a datetime must be timezone-aware")
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, enum.Enum):
        return value.value
    return value


def request_of(fields: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The API's request body and the idempotency key, from keyword arguments."""
    body = {_camel(k): _value(v) for k, v in fields.items()}
    key = body.pop("idempotencyKey", None)
    return body, key


def _translate(exc: psycopg.Error) -> Exception:
    if isinstance(exc, psycopg.errors.InvalidParameterValue):
        detail = exc.diag.message_detail
        try:
            errors = [FieldError(e["field"], e["message"]) for e in json.loads(detail or "")]
        except (ValueError, TypeError, KeyError):
            errors = [FieldError("request", exc.diag.message_primary or str(exc))]
        return ValidationFailed(errors)
    if isinstance(exc, psycopg.errors.UniqueViolation):
        return Conflict(exc.diag.message_primary or str(exc))
    return exc


def enqueue(conn: psycopg.Connection[Any], **fields: Any) -> dict[str, Any]:
    """Enqueue in `conn`'s current transaction; see the module docstring."""
    body, key = request_of(fields)
    try:
        row = conn.execute(_STATEMENT, [Jsonb(body), key]).fetchone()
    except psycopg.Error as exc:
        raise _translate(exc) from exc
    assert row is not None
    return _answer(row)


async def enqueue_async(conn: psycopg.AsyncConnection[Any], **fields: Any) -> dict[str, Any]:
    """`enqueue` for an asyncio connection."""
    body, key = request_of(fields)
    try:
        cur = await conn.execute(_STATEMENT, [Jsonb(body), key])
        row = await cur.fetchone()
    except psycopg.Error as exc:
        raise _translate(exc) from exc
    assert row is not None
    return _answer(row)


def _answer(row: Any) -> dict[str, Any]:
    # Any row factory: a tuple, or a dict of one column.
    value = next(iter(row.values())) if isinstance(row, dict) else row[0]
    assert isinstance(value, dict)
    return value
