"""The OpenAPI document, made to tell the truth about this API.

Routes read their JSON bodies themselves (see `body`) and return explicit responses, so the
document is declared, not inferred: each route names its request body and every response it can
give, problem+json ones included, with helpers from here; the models of `schemas` become the
components. FastAPI's automatic 422 is removed: this API answers invalid input with 400.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from notify_queue.api.problems import PROBLEM_MEDIA_TYPE
from notify_queue.api.schemas import REQUEST_MODELS, RESPONSE_MODELS

_REF = "#/components/schemas/{model}"

_PROBLEM_DESCRIPTIONS = {
    400: "Invalid input; `errors` names every bad field.",
    401: "No or wrong bearer token.",
    403: "A client token on a route that needs the admin token.",
    404: "No such notification, recipient or template.",
    409: "Conflicts with the notification's state, or the idempotency key was used for another "
    "request.",
    413: "The request body is larger than the server accepts.",
    415: "The body is not application/json.",
    503: "The database is unavailable; retry later.",
}
_PROBLEM_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"schema": {"type": "string"}, "description": "`Bearer`"}},
    503: {"Retry-After": {"schema": {"type": "string"}, "description": "Seconds."}},
}


def ref(model: str) -> dict[str, str]:
    return {"$ref": _REF.format(model=model)}


def json_request(model: str, *, required: bool = True) -> dict[str, Any]:
    """`openapi_extra` for a route that reads a JSON body described by `model`."""
    return {
        "requestBody": {
            "required": required,
            "content": {"application/json": {"schema": ref(model)}},
        }
    }


def ok(model: str, description: str, *, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": ref(model)}},
    }
    if headers:
        response["headers"] = headers
    return response


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {
        status: {
            "description": _PROBLEM_DESCRIPTIONS[status],
            "content": {PROBLEM_MEDIA_TYPE: {"schema": ref("Problem")}},
            **({"headers": _PROBLEM_HEADERS[status]} if status in _PROBLEM_HEADERS else {}),
        }
        for status in statuses
    }


def build_openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    document = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
    )
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    _, definitions = models_json_schema(
        [(m, "validation") for m in REQUEST_MODELS]
        + [(m, "serialization") for m in RESPONSE_MODELS],
        by_alias=True,
        ref_template=_REF,
    )
    schemas.update(definitions.get("$defs", {}))
    for path in document.get("paths", {}).values():
        for operation in path.values():
            operation.get("responses", {}).pop("422", None)
            for parameter in operation.get("parameters", []):
                parameter["schema"] = _without_null(parameter["schema"])
    app.openapi_schema = document
    return document


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    """An optional parameter is absent or a value, never null (a query string has no null)."""
    options = schema.get("anyOf")
    if not options:
        return schema
    kept = [option for option in options if option != {"type": "null"}]
    if len(kept) != 1:
        return schema
    rest = {k: v for k, v in schema.items() if k != "anyOf"}
    if "$ref" in kept[0]:
        return {"allOf": [kept[0]], **rest}
    return {**kept[0], **rest}
