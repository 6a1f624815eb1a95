"""A typed HTTP client of the whole API, sync (`Client`) and async (`AsyncClient`).

Each operation is described once, as a `Call` (method, path, query, body, and the operationId
of the OpenAPI document it is: tests/enqueue/test_client.py checks every one against the
document); the two classes only send them, through httpx, which does both kinds of I/O with one
API. A non-2xx answer raises `ApiError` with the problem+json body.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, cast

import httpx

from notify_queue.client import types as t
from notify_queue.client.enqueue import request_of


class ApiError(Exception):
    """A non-2xx answer: `status`, and the problem+json body (`problem["errors"]` for a 400)."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        super().__init__(f"{status}: {problem.get('detail') or problem.get('title') or problem}")


@dataclass(frozen=True)
class Call:
    operation_id: str
    method: str
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


def _id(value: str | uuid.UUID) -> str:
    return str(value)


class Calls:
    """Every operation as a `Call`; the clients' methods are these, sent."""

    @staticmethod
    def create(fields: dict[str, Any]) -> Call:
        body, key = request_of(fields)
        headers = {"Idempotency-Key": key} if key is not None else {}
        return Call("createNotification", "POST", "/notifications", body=body, headers=headers)

    @staticmethod
    def create_batch(items: list[dict[str, Any]]) -> Call:
        body = [{**request_of(i)[0], "idempotencyKey": request_of(i)[1]} for i in items]
        return Call(
            "createNotificationBatch", "POST", "/notifications/batch", body={"notifications": body}
        )

    @staticmethod
    def get(id: str | uuid.UUID) -> Call:
        return Call("getNotification", "GET", f"/notifications/{_id(id)}")

    @staticmethod
    def list(
        *,
        status: str | None = None,
        channel: str | None = None,
        recipient: str | None = None,
        recipient_id: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Call:
        query = {
            "status": status,
            "channel": channel,
            "recipient": recipient,
            "recipientId": recipient_id,
            "limit": limit,
            "cursor": cursor,
        }
        params = {k: v for k, v in query.items() if v is not None}
        return Call("listNotifications", "GET", "/notifications", params=params)

    @staticmethod
    def cancel(id: str | uuid.UUID) -> Call:
        return Call("cancelNotification", "POST", f"/notifications/{_id(id)}/cancel")

    @staticmethod
    def retry(id: str | uuid.UUID) -> Call:
        return Call("retryNotification", "POST", f"/notifications/{_id(id)}/retry")

    @staticmethod
    def retry_many(status: str = "DEAD_LETTERED", limit: int = 1000) -> Call:
        body = {"status": status, "limit": limit}
        return Call("retryNotifications", "POST", "/notifications/retry", body=body)

    @staticmethod
    def status() -> Call:
        return Call("getStatus", "GET", "/status")

    @staticmethod
    def put_recipient(id: str, fields: dict[str, Any]) -> Call:
        return Call("putRecipient", "PUT", f"/recipients/{id}", body=request_of(fields)[0])

    @staticmethod
    def get_recipient(id: str) -> Call:
        return Call("getRecipient", "GET", f"/recipients/{id}")

    @staticmethod
    def delete_recipient(id: str) -> Call:
        return Call("deleteRecipient", "DELETE", f"/recipients/{id}")

    @staticmethod
    def patch_preferences(id: str, fields: dict[str, Any]) -> Call:
        body = request_of(fields)[0]
        return Call(
            "patchRecipientPreferences", "PATCH", f"/recipients/{id}/preferences", body=body
        )

    @staticmethod
    def put_template(name: str, channels: dict[str, Any]) -> Call:
        return Call("putTemplate", "PUT", f"/templates/{name}", body={"channels": channels})

    @staticmethod
    def get_template(name: str) -> Call:
        return Call("getTemplate", "GET", f"/templates/{name}")

    @staticmethod
    def delete_template(name: str) -> Call:
        return Call("deleteTemplate", "DELETE", f"/templates/{name}")

    @staticmethod
    def get_escalation(id: str | uuid.UUID) -> Call:
        return Call("getEscalation", "GET", f"/escalations/{_id(id)}")

    @staticmethod
    def acknowledge_escalation(id: str | uuid.UUID, by: str | None = None) -> Call:
        body = {"by": by} if by is not None else None
        return Call(
            "acknowledgeEscalation", "POST", f"/escalations/{_id(id)}/acknowledge", body=body
        )


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _result(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        try:
            problem = response.json()
        except ValueError:
            problem = {"detail": response.text[:500]}
        raise ApiError(response.status_code, problem if isinstance(problem, dict) else {})
    if response.status_code == 204 or not response.content:
        return None
    return response.json()


def _request(call: Call) -> dict[str, Any]:
    extra: dict[str, Any] = {"params": call.params, "headers": call.headers}
    if call.body is not None:
        extra["json"] = call.body
    return extra


class Client:
    """The API over blocking HTTP. `with Client(url, token) as api: api.create(...)`."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = 30.0) -> None:
        self._http = httpx.Client(base_url=base_url, headers=_headers(token), timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def send(self, call: Call) -> Any:
        return _result(self._http.request(call.method, call.path, **_request(call)))

    def create(self, **fields: Any) -> t.Notification | t.NotificationList | t.EscalationCreated:
        """One create; with `recipient_id` the notifications it became, with `escalation` (a
        dict of steps) the escalation and its steps (t.EscalationCreated)."""
        return cast(
            "t.Notification | t.NotificationList | t.EscalationCreated",
            self.send(Calls.create(fields)),
        )

    def create_batch(self, items: list[dict[str, Any]]) -> t.BatchResponse:
        return cast("t.BatchResponse", self.send(Calls.create_batch(items)))

    def get(self, id: str | uuid.UUID) -> t.Notification:
        return cast("t.Notification", self.send(Calls.get(id)))

    def list(self, **query: Any) -> t.NotificationPage:
        return cast("t.NotificationPage", self.send(Calls.list(**query)))

    def cancel(self, id: str | uuid.UUID) -> t.Notification:
        return cast("t.Notification", self.send(Calls.cancel(id)))

    def retry(self, id: str | uuid.UUID) -> t.Notification:
        return cast("t.Notification", self.send(Calls.retry(id)))

    def retry_many(self, status: str = "DEAD_LETTERED", limit: int = 1000) -> t.RetryBatchResult:
        return cast("t.RetryBatchResult", self.send(Calls.retry_many(status, limit)))

    def status(self) -> t.QueueStatus:
        return cast("t.QueueStatus", self.send(Calls.status()))

    def put_recipient(self, id: str, **fields: Any) -> t.Recipient:
        return cast("t.Recipient", self.send(Calls.put_recipient(id, fields)))

    def get_recipient(self, id: str) -> t.Recipient:
        return cast("t.Recipient", self.send(Calls.get_recipient(id)))

    def delete_recipient(self, id: str) -> None:
        self.send(Calls.delete_recipient(id))

    def patch_preferences(self, id: str, **fields: Any) -> t.Recipient:
        return cast("t.Recipient", self.send(Calls.patch_preferences(id, fields)))

    def put_template(self, name: str, channels: dict[str, Any]) -> t.Template:
        return cast("t.Template", self.send(Calls.put_template(name, channels)))

    def get_template(self, name: str) -> t.Template:
        return cast("t.Template", self.send(Calls.get_template(name)))

    def delete_template(self, name: str) -> None:
        self.send(Calls.delete_template(name))

    def get_escalation(self, id: str | uuid.UUID) -> t.Escalation:
        return cast("t.Escalation", self.send(Calls.get_escalation(id)))

    def acknowledge_escalation(self, id: str | uuid.UUID, by: str | None = None) -> t.Escalation:
        return cast("t.Escalation", self.send(Calls.acknowledge_escalation(id, by)))


class AsyncClient:
    """The API over asyncio. `async with AsyncClient(url, token) as api: await api.create(...)`."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = 30.0) -> None:
        self._http = httpx.AsyncClient(base_url=base_url, headers=_headers(token), timeout=timeout)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def send(self, call: Call) -> Any:
        return _result(await self._http.request(call.method, call.path, **_request(call)))

    async def create(
        self, **fields: Any
    ) -> t.Notification | t.NotificationList | t.EscalationCreated:
        return cast(
            "t.Notification | t.NotificationList | t.EscalationCreated",
            await self.send(Calls.create(fields)),
        )

    async def create_batch(self, items: list[dict[str, Any]]) -> t.BatchResponse:
        return cast("t.BatchResponse", await self.send(Calls.create_batch(items)))

    async def get(self, id: str | uuid.UUID) -> t.Notification:
        return cast("t.Notification", await self.send(Calls.get(id)))

    async def list(self, **query: Any) -> t.NotificationPage:
        return cast("t.NotificationPage", await self.send(Calls.list(**query)))

    async def cancel(self, id: str | uuid.UUID) -> t.Notification:
        return cast("t.Notification", await self.send(Calls.cancel(id)))

    async def retry(self, id: str | uuid.UUID) -> t.Notification:
        return cast("t.Notification", await self.send(Calls.retry(id)))

    async def retry_many(
        self, status: str = "DEAD_LETTERED", limit: int = 1000
    ) -> t.RetryBatchResult:
        return cast("t.RetryBatchResult", await self.send(Calls.retry_many(status, limit)))

    async def status(self) -> t.QueueStatus:
        return cast("t.QueueStatus", await self.send(Calls.status()))

    async def put_recipient(self, id: str, **fields: Any) -> t.Recipient:
        return cast("t.Recipient", await self.send(Calls.put_recipient(id, fields)))

    async def get_recipient(self, id: str) -> t.Recipient:
        return cast("t.Recipient", await self.send(Calls.get_recipient(id)))

    async def delete_recipient(self, id: str) -> None:
        await self.send(Calls.delete_recipient(id))

    async def patch_preferences(self, id: str, **fields: Any) -> t.Recipient:
        return cast("t.Recipient", await self.send(Calls.patch_preferences(id, fields)))

    async def put_template(self, name: str, channels: dict[str, Any]) -> t.Template:
        return cast("t.Template", await self.send(Calls.put_template(name, channels)))

    async def get_template(self, name: str) -> t.Template:
        return cast("t.Template", await self.send(Calls.get_template(name)))

    async def delete_template(self, name: str) -> None:
        await self.send(Calls.delete_template(name))

    async def get_escalation(self, id: str | uuid.UUID) -> t.Escalation:
        return cast("t.Escalation", await self.send(Calls.get_escalation(id)))

    async def acknowledge_escalation(
        self, id: str | uuid.UUID, by: str | None = None
    ) -> t.Escalation:
        return cast("t.Escalation", await self.send(Calls.acknowledge_escalation(id, by)))
