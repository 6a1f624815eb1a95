"""Every error the API answers is an RFC 9457 problem (`application/problem+json`), built here.

This is the one place that maps exceptions to HTTP statuses: the domain hierarchy of
`notify_queue.errors` (ValidationFailed 400, NotFound 404, Conflict 409, DatabaseUnavailable and
SchemaNotCurrent 503), FastAPI's own request validation (bad query, path or header values: 400 in
the same shape as ours, never FastAPI's 422), Starlette's HTTP errors (unknown route 404, wrong
method 405, and the 401/403/413/415 raised by this package), and, last, anything unexpected (500;
the server logs the traceback, the client never sees it).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Match

from notify_queue.errors import (
    Conflict,
    DatabaseUnavailable,
    FieldError,
    NotFound,
    NotifyQueueError,
    SchemaNotCurrent,
    ValidationFailed,
)

log = logging.getLogger(__name__)

PROBLEM_MEDIA_TYPE = "application/problem+json"
_PREFIX = "urn:notify-queue:problem:"

# The problem `type` of each HTTP status this package raises itself (see docs/api-notes.md).
_HTTP_TYPES = {
    400: "bad-request",
    401: "unauthorized",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    408: "request-timeout",
    413: "payload-too-large",
    415: "unsupported-media-type",
    431: "request-header-fields-too-large",
    500: "internal-error",
    503: "service-unavailable",
}
_UNAVAILABLE_DETAIL = "the database is unavailable; retry shortly (the server log says why)"
# The one mapping of domain errors to statuses; the first matching class wins.
_DOMAIN: list[tuple[type[NotifyQueueError], int, str]] = [
    (ValidationFailed, 400, "validation-failed"),
    (NotFound, 404, "not-found"),
    (Conflict, 409, "conflict"),
    (DatabaseUnavailable, 503, "database-unavailable"),
    (SchemaNotCurrent, 503, "schema-not-current"),
]


def problem(
    status: int,
    detail: str,
    *,
    kind: str | None = None,
    errors: Sequence[FieldError] | None = None,
    **extensions: Any,
) -> dict[str, Any]:
    """A problem document; `errors` only for validation, extensions (camelCase) after it."""
    document: dict[str, Any] = {
        "type": _PREFIX + (kind or _HTTP_TYPES.get(status, "error")),
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
    }
    if errors is not None:
        document["errors"] = [{"field": e.field, "message": e.message} for e in errors]
    document.update({k: v for k, v in extensions.items() if v is not None})
    return document


def problem_bytes(status: int, detail: str, **kwargs: Any) -> bytes:
    # ASCII escapes: field names echo client input, which may hold unpaired surrogates.
    return json.dumps(problem(status, detail, **kwargs)).encode()


class ProblemResponse(Response):
    media_type = PROBLEM_MEDIA_TYPE

    def __init__(self, document: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        super().__init__(
            json.dumps(document).encode(),
            status_code=document["status"],
            headers=headers,
        )


def domain_problem(exc: NotifyQueueError) -> dict[str, Any]:
    """The problem document of a domain error (also used for one item of a batch)."""
    for cls, status, kind in _DOMAIN:
        if isinstance(exc, cls):
            if isinstance(exc, ValidationFailed):
                return problem(status, "the request is invalid", kind=kind, errors=exc.errors)
            if isinstance(exc, Conflict):
                return problem(status, exc.detail, kind=kind, existingId=exc.existing_id)
            if isinstance(exc, DatabaseUnavailable):
                # The driver's text names the server (host, port): it goes to the log only.
                return problem(status, _UNAVAILABLE_DETAIL, kind=kind)
            return problem(status, str(exc), kind=kind)
    log.error("unmapped error %s: %s", type(exc).__name__, exc)
    return problem(500, "internal error", kind="internal-error")


def field_errors_from_validation(exc: RequestValidationError) -> list[FieldError]:
    """FastAPI's errors for query, path and header values, named as the client wrote them."""
    errors = []
    for error in exc.errors():
        loc = [str(part) for part in error.get("loc", ())]
        name = ".".join(loc[1:]) if len(loc) > 1 else ".".join(loc) or "$"
        errors.append(FieldError(name, str(error.get("msg", "is invalid"))))
    return errors


async def _domain_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, NotifyQueueError)
    document = domain_problem(exc)
    if document["status"] == 503:
        log.warning("%s %s: %s", request.method, request.url.path, exc)
    return ProblemResponse(
        document, headers={"Retry-After": "1"} if document["status"] == 503 else None
    )


async def _request_validation_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = field_errors_from_validation(exc)
    return ProblemResponse(
        problem(400, "the request is invalid", kind="validation-failed", errors=errors)
    )


async def _http_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(status).phrase
    if status == 404 and detail == HTTPStatus.NOT_FOUND.phrase:
        detail = f"no route {request.url.path}"
    headers = dict(exc.headers or {})
    if status == 405:
        methods, templates = _routes_of_path(request)
        detail = f"{request.method} is not allowed on {request.url.path}"
        hint = next(
            (_HINTS[(request.method, t)] for t in templates if (request.method, t) in _HINTS), None
        )
        if hint:
            detail += f"; {hint.format(path=request.url.path)}"
        # Starlette names only the first route that matched the path; Allow lists them all.
        headers["Allow"] = ", ".join(sorted(methods))
    return ProblemResponse(problem(status, detail), headers=headers)


# What a client that used the wrong method most likely wanted ({path}: the request's path).
_HINTS = {
    ("DELETE", "/notifications/{id}"): "to cancel a notification, POST {path}/cancel",
}


def _routes_of_path(request: Request) -> tuple[set[str], list[str]]:
    """The methods of the routes for this path, and their path templates; a literal route
    (`/notifications/batch`) hides the templates it also matches (`/notifications/{id}`), as
    it is a resource of its own."""
    matching = [
        route
        for route in request.app.router.routes
        if route.matches(request.scope)[0] is not Match.NONE
    ]
    literal = [route for route in matching if not getattr(route, "param_convertors", None)]
    methods: set[str] = set()
    for route in literal or matching:
        methods |= set(getattr(route, "methods", None) or ())
    return methods, [str(getattr(route, "path_format", "")) for route in literal or matching]


async def _unexpected_handler(request: Request, exc: Exception) -> Response:
    # Starlette re-raises after this response, so the server logs the traceback once, and uvicorn
    # then closes the connection: `Connection: close` says so, or a client would send its next
    # request on that kept-alive connection and read nothing back (tests/api/test_real_server.py).
    return ProblemResponse(
        problem(500, "internal error; see the server log"), headers={"Connection": "close"}
    )


def install_problem_handlers(app: FastAPI) -> None:
    app.add_exception_handler(NotifyQueueError, _domain_handler)
    app.add_exception_handler(RequestValidationError, _request_validation_handler)
    app.add_exception_handler(StarletteHTTPException, _http_handler)
    app.add_exception_handler(Exception, _unexpected_handler)
