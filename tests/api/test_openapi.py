"""GET /openapi.json describes the API truthfully: every route of the contract, camelCase request
and response models, problem+json for every error a route can give (never FastAPI's 422), the
Idempotency-Key header, and the bearer scheme exactly when tokens are set. The request model of
the document lists the same fields as the validation rules in `services.validation`.
"""

from __future__ import annotations

from typing import Any

import httpx

from notify_queue.api.app import create_app
from notify_queue.services.validation import NotificationRequest
from tests.api.support import api_settings

CONTRACT_OPERATIONS = {
    ("post", "/notifications"),
    ("post", "/notifications/batch"),
    ("get", "/notifications/{id}"),
    ("get", "/notifications"),
    ("post", "/notifications/{id}/cancel"),
    ("post", "/notifications/{id}/retry"),
    ("post", "/notifications/retry"),
    ("get", "/status"),
    ("get", "/metrics"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    # CONTRACT §9
    ("put", "/recipients/{id}"),
    ("get", "/recipients/{id}"),
    ("delete", "/recipients/{id}"),
    ("patch", "/recipients/{id}/preferences"),
    ("put", "/templates/{name}"),
    ("get", "/templates/{name}"),
    ("delete", "/templates/{name}"),
    ("get", "/escalations/{id}"),
    ("post", "/escalations/{id}/acknowledge"),
    # Delivery receipts, the suppression list and one-click unsubscribe (docs/receipts.md)
    ("post", "/providers/{name}/events"),
    ("get", "/suppressions"),
    ("delete", "/suppressions/{channel}/{address}"),
    ("get", "/unsubscribe/{token}"),
    ("post", "/unsubscribe/{token}"),
}
# Routes a vendor or a recipient calls, without the API's token.
UNTOKENED_ROUTES = {
    ("get", "/metrics"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("post", "/providers/{name}/events"),
    ("get", "/unsubscribe/{token}"),
    ("post", "/unsubscribe/{token}"),
}
# Of those, the one that answers 401 itself: a request its vendor did not sign.
SIGNED_ROUTES = {("post", "/providers/{name}/events")}


def document(**settings: Any) -> dict[str, Any]:
    return create_app(api_settings("postgresql:///unused", **settings)).openapi()


def operations(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method, path): op for path, item in doc["paths"].items() for method, op in item.items()
    }


async def test_the_document_is_served_and_lists_exactly_the_contracts_operations(
    shared_client: httpx.AsyncClient,
) -> None:
    response = await shared_client.get("/openapi.json")
    assert response.status_code == 200
    doc = response.json()
    assert doc["openapi"].startswith("3.")
    assert set(operations(doc)) == CONTRACT_OPERATIONS


def test_errors_are_documented_as_problem_json_and_no_route_documents_422() -> None:
    for (method, path), op in operations(document()).items():
        responses = op["responses"]
        assert "422" not in responses, (method, path)
        for status, response in responses.items():
            if int(status) >= 400:
                assert list(response["content"]) == ["application/problem+json"], (
                    method,
                    path,
                    status,
                )
                assert response["content"]["application/problem+json"]["schema"] == {
                    "$ref": "#/components/schemas/Problem"
                }
    create = operations(document())[("post", "/notifications")]["responses"]
    assert set(create) == {"200", "201", "400", "409", "413", "415", "503"}
    assert "Location" in create["201"]["headers"]


def test_models_use_camel_case_names() -> None:
    schemas = document()["components"]["schemas"]
    assert "HTTPValidationError" not in schemas
    assert {"sendAt", "nextAttemptAt", "attemptCount", "providerMessageId", "createdAt"} <= set(
        schemas["Notification"]["properties"]
    )
    assert schemas["Retry"]["required"] == ["at", "fromStatus"]
    assert {"oldestDueAgeSeconds", "counts", "due", "database", "providers"} == set(
        schemas["QueueStatus"]["properties"]
    )
    assert {"items", "nextCursor"} == set(schemas["NotificationPage"]["properties"])
    assert {"errors", "existingId", "type", "title", "status", "detail"} <= set(
        schemas["Problem"]["properties"]
    )


def test_the_create_model_has_the_same_fields_as_the_validation_rules() -> None:
    schemas = document()["components"]["schemas"]
    rules = {field.alias or name for name, field in NotificationRequest.model_fields.items()}
    assert set(schemas["NotificationCreate"]["properties"]) == rules
    assert schemas["NotificationCreate"]["additionalProperties"] is False
    # An address or a stored recipient; a body or a template (CONTRACT §9).
    assert schemas["NotificationCreate"]["allOf"] == [
        {"oneOf": [{"required": ["channel", "recipient"]}, {"required": ["recipientId"]}]},
        {"oneOf": [{"required": ["body"]}, {"required": ["template"]}]},
    ]
    assert "idempotencyKey" in schemas["BatchNotificationCreate"]["required"]


def test_the_idempotency_key_header_is_documented_on_create() -> None:
    create = operations(document())[("post", "/notifications")]
    (header,) = [p for p in create["parameters"] if p["in"] == "header"]
    assert header["name"] == "Idempotency-Key" and header["required"] is False
    assert header["schema"]["maxLength"] == 255
    assert create["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/NotificationCreate"
    }


def test_post_notifications_is_registered_once_and_that_route_is_the_documented_one() -> None:
    app = create_app(api_settings("postgresql:///unused"))
    creates = [
        route
        for route in app.routes
        if getattr(route, "path", None) == "/notifications"
        and "POST" in (getattr(route, "methods", None) or ())
    ]
    assert len(creates) == 1
    assert getattr(creates[0], "include_in_schema", False) is True
    assert getattr(creates[0], "operation_id", None) == "createNotification"


def test_without_tokens_no_security_is_declared() -> None:
    doc = document()
    assert "securitySchemes" not in doc.get("components", {})
    assert all(
        "security" not in op and ("401" in op["responses"]) is (key in SIGNED_ROUTES)
        for key, op in operations(doc).items()
    )


def test_with_tokens_the_bearer_scheme_guards_exactly_the_protected_routes() -> None:
    doc = document(api_token="a", admin_token="b")
    assert doc["components"]["securitySchemes"]["bearerToken"] == {
        "type": "http",
        "scheme": "bearer",
        "description": doc["components"]["securitySchemes"]["bearerToken"]["description"],
    }
    ops = operations(doc)
    for key, op in ops.items():
        assert ("security" in op) is (key not in UNTOKENED_ROUTES), key
        untokened = key in UNTOKENED_ROUTES and key not in SIGNED_ROUTES
        assert ("401" in op["responses"]) is not untokened, key
    admin_routes = {
        ("post", "/notifications/{id}/cancel"),
        ("post", "/notifications/{id}/retry"),
        ("post", "/notifications/retry"),
    }
    for key, op in ops.items():
        assert ("403" in op["responses"]) is (key in admin_routes), key


def test_with_only_an_api_token_no_route_documents_403() -> None:
    ops = operations(document(api_token="a"))
    assert all("403" not in op["responses"] for op in ops.values())
    assert "401" in ops[("post", "/notifications/{id}/cancel")]["responses"]


def test_with_only_an_admin_token_only_cancel_and_retry_document_401() -> None:
    ops = operations(document(admin_token="b"))
    guarded = {key for key, op in ops.items() if "401" in op["responses"]}
    assert guarded == {
        ("post", "/notifications/{id}/cancel"),
        ("post", "/notifications/{id}/retry"),
        ("post", "/notifications/retry"),
        *SIGNED_ROUTES,
    }
