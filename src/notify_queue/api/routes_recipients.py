"""`/recipients*` and `/templates*`: stored recipients with their preferences, and templates
(docs/recipients.md). Thin like the notification routes: bodies are read as sent and validated by
`services.recipients` (every bad field named in one 400); the answers are the stored records.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from notify_queue.api.auth import Auth
from notify_queue.api.body import read_json, storable_errors
from notify_queue.api.openapi import json_request, ok, problems
from notify_queue.api.query import reject_unknown_query_parameters
from notify_queue.api.runtime import Runtime
from notify_queue.api.schemas import recipient_json, template_json
from notify_queue.errors import ValidationFailed

_RECIPIENT = "/recipients/{id}"
_TEMPLATE = "/templates/{name}"


def add_recipient_routes(router: APIRouter, auth: Auth) -> None:
    client = [Depends(auth.client()), Depends(reject_unknown_query_parameters)]
    denied = auth.client_denials

    @router.put(
        _RECIPIENT,
        tags=["recipients"],
        operation_id="putRecipient",
        summary="Create or replace a recipient (contacts, timezone, preferences)",
        dependencies=client,
        openapi_extra=json_request("RecipientPut"),
        responses={
            201: ok("Recipient", "Created."),
            200: ok("Recipient", "Replaced."),
            **problems(400, *denied, 413, 415, 503),
        },
    )
    async def put_recipient(id: str, request: Request, runtime: Runtime) -> JSONResponse:
        recipient, created = await runtime.recipients.put(id, await _body(request))
        return _stored(recipient_json(recipient), created=created)

    @router.get(
        _RECIPIENT,
        tags=["recipients"],
        operation_id="getRecipient",
        summary="One recipient",
        dependencies=client,
        responses={200: ok("Recipient", "The recipient."), **problems(400, *denied, 404, 503)},
    )
    async def get_recipient(id: str, runtime: Runtime) -> JSONResponse:
        return JSONResponse(recipient_json(await runtime.recipients.get(id)))

    @router.delete(
        _RECIPIENT,
        tags=["recipients"],
        operation_id="deleteRecipient",
        summary="Delete a recipient; its queued notifications are then suppressed at send time",
        status_code=204,
        dependencies=client,
        responses={204: {"description": "Deleted."}, **problems(400, *denied, 404, 503)},
    )
    async def delete_recipient(id: str, runtime: Runtime) -> Response:
        await runtime.recipients.delete(id)
        return Response(status_code=204)

    @router.patch(
        _RECIPIENT + "/preferences",
        tags=["recipients"],
        operation_id="patchRecipientPreferences",
        summary="Merge preferences (opt-outs, quiet hours) into a recipient's",
        dependencies=client,
        openapi_extra=json_request("PreferencesPatch"),
        responses={
            200: ok("Recipient", "The recipient with the merged preferences."),
            **problems(400, *denied, 404, 413, 415, 503),
        },
    )
    async def patch_preferences(id: str, request: Request, runtime: Runtime) -> JSONResponse:
        data = await _body(request)
        return JSONResponse(recipient_json(await runtime.recipients.merge_preferences(id, data)))

    @router.put(
        _TEMPLATE,
        tags=["templates"],
        operation_id="putTemplate",
        summary="Create or update a template; its version increments on every change",
        dependencies=client,
        openapi_extra=json_request("TemplatePut"),
        responses={
            201: ok("Template", "Created."),
            200: ok("Template", "Updated (or unchanged: the same version)."),
            **problems(400, *denied, 413, 415, 503),
        },
    )
    async def put_template(name: str, request: Request, runtime: Runtime) -> JSONResponse:
        template, created = await runtime.recipients.template_put(name, await _body(request))
        return _stored(template_json(template), created=created)

    @router.get(
        _TEMPLATE,
        tags=["templates"],
        operation_id="getTemplate",
        summary="One template",
        dependencies=client,
        responses={200: ok("Template", "The template."), **problems(400, *denied, 404, 503)},
    )
    async def get_template(name: str, runtime: Runtime) -> JSONResponse:
        return JSONResponse(template_json(await runtime.recipients.template_get(name)))

    @router.delete(
        _TEMPLATE,
        tags=["templates"],
        operation_id="deleteTemplate",
        summary="Delete a template (notifications rendered from it keep their text)",
        status_code=204,
        dependencies=client,
        responses={204: {"description": "Deleted."}, **problems(400, *denied, 404, 503)},
    )
    async def delete_template(name: str, runtime: Runtime) -> Response:
        await runtime.recipients.template_delete(name)
        return Response(status_code=204)


async def _body(request: Request) -> object:
    data = await read_json(request, required=True)
    if errors := storable_errors(data):
        raise ValidationFailed(errors)
    return data


def _stored(record: dict[str, object], *, created: bool) -> JSONResponse:
    """A PUT's answer: the stored record, 201 when the PUT created it, else 200."""
    return JSONResponse(record, status_code=201 if created else 200)
