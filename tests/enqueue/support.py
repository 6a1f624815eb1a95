"""Helpers of the enqueue tests: call notify_queue_enqueue and read its error as the API's."""

from __future__ import annotations

import json
from typing import Any

import psycopg
from psycopg.types.json import Jsonb


def call_function(conn: psycopg.Connection[Any], body: Any, key: str | None) -> Any:
    row = conn.execute("SELECT notify_queue_enqueue(%s, %s)", [Jsonb(body), key]).fetchone()
    assert row is not None
    return row[0]


def function_errors(database_url: str, body: Any, key: str | None) -> list[dict[str, str]] | None:
    """The function's field errors for `body` (None: it accepted it), in a rolled-back
    transaction so the case table leaves nothing behind."""
    with psycopg.connect(database_url) as conn:
        try:
            call_function(conn, body, key)
        except psycopg.errors.InvalidParameterValue as exc:
            return list(json.loads(exc.diag.message_detail or "[]"))
        finally:
            conn.rollback()
    return None
