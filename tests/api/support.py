"""Helpers for the API tests: an app client, request bodies, and direct SQL for set-up."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import psycopg
from fastapi import FastAPI

from notify_queue.api.app import create_app
from notify_queue.repositories.db import Database
from notify_queue.settings import ApiSettings

PROBLEM = "application/problem+json"


def api_settings(database_url: str, **overrides: Any) -> ApiSettings:
    return ApiSettings(database_url=database_url, **overrides)


@asynccontextmanager
async def running_app(
    database_url: str, *, db: Database | None = None, **overrides: Any
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """The app with its lifespan running, as a server runs it, and an httpx client on it."""
    app = create_app(api_settings(database_url, **overrides), db=db)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api.test") as http:
            yield app, http


@asynccontextmanager
async def api_client(
    database_url: str, *, db: Database | None = None, **overrides: Any
) -> AsyncIterator[httpx.AsyncClient]:
    async with running_app(database_url, db=db, **overrides) as (_, http):
        yield http


def email(**fields: Any) -> dict[str, Any]:
    """A valid create body for the email channel; `fields` override or add."""
    body: dict[str, Any] = {"channel": "email", "recipient": "a@example.com", "body": "hello"}
    body.update(fields)
    return body


def key() -> str:
    return f"k-{uuid.uuid4().hex}"


async def create(
    http: httpx.AsyncClient, body: dict[str, Any] | None = None, **fields: Any
) -> dict[str, Any]:
    """Create one notification (asserting 201) and return it."""
    response = await http.post(
        "/notifications", json=body or email(**fields), headers={"Idempotency-Key": key()}
    )
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


async def sql(database_url: str, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run one statement directly (test set-up and checks only); return its rows, if any."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cursor = await conn.execute(statement, params)
        return await cursor.fetchall() if cursor.description else []


def fields_named(response: httpx.Response) -> set[str]:
    """The fields a 400 problem names."""
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == PROBLEM
    return {e["field"] for e in response.json()["errors"]}
