"""`/notifications*`: create (one or a batch), read, list, cancel and retry (docs/api-reference.md).

Thin on purpose: the rules are in `services` (validation, idempotency by a unique key in the
database, state changes as conditional updates); this module turns HTTP into service calls and
results into the documented responses. A create resolves its idempotency key from the header or
the body, names every bad field at once, and answers 201 (created), 200 (the same request again)
or 409 (the key with another request). A batch validates each item on its own and enqueues all
valid ones with one `enqueue_many` call: two statements for up to 1,000 items.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated, Any, cast

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.convertors import Convertor, register_url_convertor
from starlette.types import Receive, Scope, Send

from notify_queue.api.auth import Auth
from notify_queue.api.body import Absent, read_json, storable_errors
from notify_queue.api.openapi import json_request, ok, problems
from notify_queue.api.problems import domain_problem
from notify_queue.api.query import reject_unknown_query_parameters
from notify_queue.api.responses import JsonResponse
from notify_queue.api.runtime import ApiRuntime, Runtime
from notify_queue.api.schemas import (
    RetryBatchRequest,
    RetryBatchResult,
    escalation_created_json,
    notification_json,
)
from notify_queue.errors import Conflict, FieldError, ValidationFailed
from notify_queue.limits import MAX_RECIPIENT_CHARS
from notify_queue.models import Channel, CreateResult, Status, WaitingReason
from notify_queue.services.notifications import MAX_BATCH, MAX_PAGE
from notify_queue.services.validation import (
    NotificationRequest,
    PreparedRequest,
    check_idempotency_key,
    parse_request,
    prepare_request,
    request_hash,
)

# The create's `Idempotency-Key` header, documented here and read by the handler itself: as a
# FastAPI `Header` parameter it was re-analysed on every request, which cost more than the rest
# of the create's parameters together. Checked in the handler, so a bad header and bad fields
# are named in one 400.
_KEY_DESCRIPTION = (
    "1-255 printable ASCII characters; or `idempotencyKey` in the body (equal if both)."
)
_IDEMPOTENCY_KEY_PARAMETER = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "schema": {
        "type": "string",
        "description": _KEY_DESCRIPTION,
        "pattern": "^[!-~]{1,255}$",
        "minLength": 1,
        "maxLength": 255,
        "title": "Idempotency-Key",
    },
    "description": _KEY_DESCRIPTION,
}


class _NotificationId(Convertor[str]):
    """An `{id}` segment that is not a literal sibling route: `/notifications/batch` and
    `/notifications/retry` are resources of their own, so `GET /notifications/batch` is a 405,
    not an invalid id. Everything else goes on to the handler, where a non-uuid is a 400."""

    regex = r"(?!(?:batch|retry)$)[^/]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("notification_id", _NotificationId())
_ONE = "/notifications/{id:notification_id}"
# A batch item's status -> the outcome it counts as in notify_queue_creates_total.
_BATCH_OUTCOMES = {201: "created", 200: "existing", 409: "conflict", 400: "invalid"}
_LOCATION = {"Location": {"schema": {"type": "string"}, "description": "`/notifications/{id}`"}}


class _ServedDirectly(APIRoute):
    """A route documented from its declaration like any other, whose endpoint (Request in,
    Response out) is called directly, without FastAPI's per-request machinery: solving
    dependencies, two exit stacks and the route's own exception wrapper cost more per single
    create than everything the create itself does (docs/performance.md).

    Its declared `dependencies` therefore document the route (the security scheme) but do not
    run: the endpoint makes the same checks itself. Exceptions go to the app's exception
    middleware, which answers them with the same problem documents as on any other route.
    """

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        handler = cast(Callable[[Request], Awaitable[Response]], endpoint)

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            response = await handler(Request(scope, receive, send))
            await response(scope, receive, send)

        self.app = app


def add_notification_routes(router: APIRouter, auth: Auth) -> None:
    # Authentication first, so nothing about the request is judged before the caller is known.
    client = [Depends(auth.client()), Depends(reject_unknown_query_parameters)]
    admin = [Depends(auth.admin()), Depends(reject_unknown_query_parameters)]
    client_denied = auth.client_denials
    admin_denied = auth.admin_denials

    async def create_notification(request: Request) -> Response:
        # Served as a plain endpoint (`_ServedDirectly`), so it makes the declared dependencies'
        # checks itself, in the same order: the caller first, then unknown query parameters.
        await auth.check_client(request)
        await reject_unknown_query_parameters(request)
        runtime: ApiRuntime = request.app.state.runtime
        creates = runtime.metrics.creates
        try:
            data = await read_json(request, required=True)
            new = _one_request(
                data,
                header_key=request.headers.get("idempotency-key"),
                now=datetime.now(UTC),
                default_region=runtime.default_region,
            )
            if new.request.escalation is not None:
                return await _create_escalation(runtime, new)
            result = await runtime.service.create(new)
            if isinstance(result, ValidationFailed):
                raise result
        except ValidationFailed:
            creates["invalid"].inc()
            raise
        if result.conflict:
            creates["conflict"].inc()
            raise _key_conflict(new.idempotency_key, result.notification.id)
        creates["created" if result.created else "existing"].inc()
        status = 201 if result.created else 200
        if new.request.recipient_id is not None:
            return JsonResponse(_created_json(result), status_code=status)
        body = notification_json(result.notification)
        if result.created:
            location = f"/notifications/{result.notification.id}"
            return JsonResponse(body, status_code=201, headers={"Location": location})
        return JsonResponse(body, status_code=200)

    # The one registration of `POST /notifications`: documented from this declaration like every
    # route, served without FastAPI's per-request dependency solving (see `_ServedDirectly`).
    router.add_api_route(
        "/notifications",
        create_notification,
        methods=["POST"],
        route_class_override=_ServedDirectly,
        tags=["notifications"],
        operation_id="createNotification",
        summary="Enqueue one notification (idempotent)",
        status_code=201,
        dependencies=client,
        openapi_extra={
            "parameters": [_IDEMPOTENCY_KEY_PARAMETER],
            **json_request("NotificationCreate"),
        },
        responses={
            201: ok(
                "Notification",
                "Created. With recipientId: `{notifications}`; with escalation: "
                "`EscalationCreated`.",
                headers=_LOCATION,
            ),
            200: ok("Notification", "The same request with the same key again: the original."),
            **problems(400, *client_denied, 409, 413, 415, 503),
        },
    )

    @router.post(
        "/notifications/batch",
        tags=["notifications"],
        operation_id="createNotificationBatch",
        summary="Enqueue up to 1,000 notifications, one result per item in order",
        dependencies=client,
        openapi_extra=json_request("BatchCreate"),
        responses={
            200: ok("BatchResponse", "One result per item: 201, 200, 409 or 400."),
            **problems(400, *client_denied, 413, 415, 503),
        },
    )
    async def create_notification_batch(request: Request, runtime: Runtime) -> JsonResponse:
        items = _batch_items(await read_json(request, required=True))
        results: list[dict[str, Any]] = [{}] * len(items)  # each replaced below
        valid: list[tuple[int, PreparedRequest]] = []
        checked_items = _batch_requests(
            items, now=datetime.now(UTC), default_region=runtime.default_region
        )
        for index, checked in enumerate(checked_items):
            if isinstance(checked, ValidationFailed):
                results[index] = {"status": 400, "error": domain_problem(checked)}
            else:
                valid.append((index, checked))
        if valid:
            enqueued = await runtime.service.create_many([new for _, new in valid])
            for (index, new), result in zip(valid, enqueued, strict=True):
                if isinstance(result, ValidationFailed):
                    results[index] = {"status": 400, "error": domain_problem(result)}
                elif result.conflict:
                    conflict = _key_conflict(new.idempotency_key, result.notification.id)
                    results[index] = {"status": 409, "error": domain_problem(conflict)}
                else:
                    created = (
                        _created_json(result)
                        if new.request.recipient_id is not None
                        else {"notification": notification_json(result.notification)}
                    )
                    results[index] = {"status": 201 if result.created else 200, **created}
        # One increment per outcome, not per item: each takes the counter's lock.
        outcomes = Counter(_BATCH_OUTCOMES[item_result["status"]] for item_result in results)
        for outcome, count in outcomes.items():
            runtime.metrics.creates[outcome].inc(count)
        return JsonResponse({"results": results})

    @router.get(
        _ONE,
        tags=["notifications"],
        operation_id="getNotification",
        summary="One notification",
        dependencies=client,
        responses={
            200: ok("Notification", "The notification."),
            **problems(400, *client_denied, 404, 503),
        },
    )
    async def get_notification(id: uuid.UUID, runtime: Runtime) -> JsonResponse:
        return JsonResponse(notification_json(await runtime.service.get(id)))

    @router.get(
        "/notifications",
        tags=["notifications"],
        operation_id="listNotifications",
        summary="A page of notifications, oldest first (keyset pagination)",
        dependencies=client,
        responses={200: ok("NotificationPage", "A page."), **problems(400, *client_denied, 503)},
    )
    async def list_notifications(
        runtime: Runtime,
        status: Annotated[Status | None, Query()] = None,
        channel: Annotated[Channel | None, Query()] = None,
        recipient: Annotated[
            str | None, Query(min_length=1, max_length=MAX_RECIPIENT_CHARS)
        ] = None,
        recipient_id: Annotated[
            str | None,
            Query(
                alias="recipientId",
                min_length=1,
                max_length=255,
                description="A stored recipient's id: its user-targeted notifications.",
            ),
        ] = None,
        waiting: Annotated[
            WaitingReason | None,
            Query(
                description="Only PENDING notifications waiting for this reason now "
                '(docs/design.md "Why a notification waits").'
            ),
        ] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
        cursor: Annotated[
            str | None,
            # An empty value is no cursor at all: refused (400) like any other malformed
            # cursor, as the document says (minLength 1), rather than read as "first page".
            Query(min_length=1, max_length=512, description="`nextCursor` of the previous page."),
        ] = None,
    ) -> JsonResponse:
        if recipient is not None and (errors := storable_errors(recipient, "recipient")):
            raise ValidationFailed(errors)
        if recipient_id is not None and (errors := storable_errors(recipient_id, "recipientId")):
            raise ValidationFailed(errors)
        items, next_cursor = await runtime.service.list(
            status=status,
            channel=channel.value if channel else None,
            recipient=recipient,
            recipient_id=recipient_id,
            cursor=cursor,
            limit=limit,
            waiting=waiting,
        )
        return JsonResponse(
            {"items": [notification_json(n) for n in items], "nextCursor": next_cursor}
        )

    @router.post(
        _ONE + "/cancel",
        tags=["notifications"],
        operation_id="cancelNotification",
        summary="Cancel a PENDING notification",
        dependencies=admin,
        responses={
            200: ok("Notification", "Now CANCELLED."),
            **problems(400, *admin_denied, 404, 409, 503),
        },
    )
    async def cancel_notification(id: uuid.UUID, runtime: Runtime) -> JsonResponse:
        return JsonResponse(notification_json(await runtime.service.cancel(id)))

    @router.post(
        _ONE + "/retry",
        tags=["notifications"],
        operation_id="retryNotification",
        summary="Retry a FAILED or DEAD_LETTERED notification",
        dependencies=admin,
        responses={
            200: ok("Notification", "Back to PENDING with attemptCount 0; the retry recorded."),
            **problems(400, *admin_denied, 404, 409, 503),
        },
    )
    async def retry_notification(id: uuid.UUID, runtime: Runtime) -> JsonResponse:
        return JsonResponse(notification_json(await runtime.service.retry(id)))

    @router.post(
        "/notifications/retry",
        tags=["notifications"],
        operation_id="retryNotifications",
        summary="Retry up to `limit` notifications in one status, oldest first",
        dependencies=admin,
        openapi_extra=json_request("RetryBatchRequest", required=False),
        responses={
            200: ok("RetryBatchResult", "How many were retried and how many remain."),
            **problems(400, *admin_denied, 413, 415, 503),
        },
    )
    async def retry_notifications(request: Request, runtime: Runtime) -> JsonResponse:
        data = await read_json(request, required=False)
        try:
            wanted = RetryBatchRequest.model_validate(
                {} if data is Absent.BODY else data, strict=True
            )
        except ValidationError as exc:
            raise ValidationFailed(_field_errors(exc)) from None
        retried, remaining = await runtime.service.retry_batch(
            status=Status(wanted.status), limit=wanted.limit
        )
        result = RetryBatchResult(retried=retried, remaining=remaining)
        return JsonResponse(result.model_dump(by_alias=True))


async def _create_escalation(runtime: ApiRuntime, new: PreparedRequest) -> Response:
    """A create with `escalation` (docs/escalation.md): 201 with the escalation and its steps,
    200 for the same request again, 409 for the key with another request."""
    creates = runtime.metrics.creates
    result = await runtime.escalations.create(new)
    if result.conflict:
        creates["conflict"].inc()
        raise _key_conflict(new.idempotency_key, result.escalation.notifications[0].id)
    creates["created" if result.created else "existing"].inc()
    return JsonResponse(
        escalation_created_json(result.escalation), status_code=201 if result.created else 200
    )


def _created_json(result: CreateResult) -> dict[str, Any]:
    """A user-targeted create's answer: every notification the request became."""
    made = result.notifications or (result.notification,)
    return {"notifications": [notification_json(n) for n in made]}


def _one_request(
    data: Any, *, header_key: str | None, now: datetime, default_region: str | None
) -> PreparedRequest:
    """Validate a single create, header included; every bad field is named in one error."""
    if not isinstance(data, dict):
        raise ValidationFailed([FieldError("$", "must be a JSON object")])
    errors = storable_errors(data)
    request: NotificationRequest | None = None
    if header_key is not None:
        try:
            check_idempotency_key(header_key)
        except ValidationFailed as exc:
            errors += exc.errors
    try:
        request = parse_request(data, default_region=default_region)
    except ValidationFailed as exc:
        errors += exc.errors
    body_key = data.get("idempotencyKey")
    if header_key is not None and isinstance(body_key, str) and body_key != header_key:
        errors.append(FieldError("idempotencyKey", "differs from the Idempotency-Key header"))
    if header_key is None and body_key is None:
        errors.append(
            FieldError(
                "Idempotency-Key", "is required: send the header or idempotencyKey in the body"
            )
        )
    if errors or request is None:
        raise ValidationFailed(_unique(errors))
    key = header_key if header_key is not None else str(body_key)
    return prepare_request(request, idempotency_key=key, request_digest=request_hash(data), now=now)


def _batch_items(data: Any) -> list[Any]:
    if not isinstance(data, dict):
        raise ValidationFailed([FieldError("$", "must be a JSON object")])
    errors = [FieldError(k, "is not a field of a batch") for k in data if k != "notifications"]
    items = data.get("notifications")
    if items is None:
        errors.append(FieldError("notifications", "is required"))
    elif not isinstance(items, list):
        errors.append(FieldError("notifications", "must be an array"))
    elif len(items) > MAX_BATCH:
        errors.append(FieldError("notifications", f"has {len(items)} items; at most {MAX_BATCH}"))
    if errors:
        raise ValidationFailed(errors)
    assert isinstance(items, list)
    return items


def _batch_requests(
    items: list[Any], *, now: datetime, default_region: str | None
) -> list[PreparedRequest | ValidationFailed]:
    """Each item checked as a single create is (its stored text, its fields, its key, its times),
    every bad field of an item named in its one error. A step at a time over the whole batch, not
    item by item: the same checks and errors, cheaper per item because each step's code stays
    warm across the batch."""
    prefixes = [f"notifications[{index}]." for index in range(len(items))]
    errors: list[list[FieldError]] = [
        storable_errors(item, prefix.rstrip("."))
        if isinstance(item, dict)
        else [FieldError(prefix.rstrip("."), "must be a JSON object")]
        for item, prefix in zip(items, prefixes, strict=True)
    ]
    requests: list[NotificationRequest | None] = [None] * len(items)
    for index, (item, prefix) in enumerate(zip(items, prefixes, strict=True)):
        if isinstance(item, dict):
            try:
                requests[index] = parse_request(item, prefix=prefix, default_region=default_region)
            except ValidationFailed as exc:
                errors[index] += exc.errors
            if item.get("idempotencyKey") is None:
                errors[index].append(
                    FieldError(prefix + "idempotencyKey", "is required for each item of a batch")
                )
    checked: list[PreparedRequest | ValidationFailed] = []
    for item, prefix, request, found in zip(items, prefixes, requests, errors, strict=True):
        if found or request is None:
            checked.append(ValidationFailed(_unique(found)))
            continue
        try:
            checked.append(
                prepare_request(
                    request,
                    idempotency_key=str(item["idempotencyKey"]),
                    request_digest=request_hash(item),
                    now=now,
                    field_prefix=prefix,
                )
            )
        except ValidationFailed as exc:
            checked.append(exc)
    return checked


def _key_conflict(key: str, existing: uuid.UUID) -> Conflict:
    return Conflict(
        f"idempotency key {key!r} was already used with a different request, "
        f"by notification {existing}",
        existing_id=str(existing),
    )


def _field_errors(exc: ValidationError) -> list[FieldError]:
    return [
        FieldError(
            ".".join(str(p) for p in e["loc"]) or "$", e["msg"].removeprefix("Value error, ")
        )
        for e in exc.errors()
    ]


def _unique(errors: list[FieldError]) -> list[FieldError]:
    return list(dict.fromkeys(errors))
