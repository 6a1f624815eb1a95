"""`/escalations/{id}` (docs/escalation.md): read an escalation and acknowledge it. Created by
`POST /notifications` with `escalation` (routes_notifications). The rules and the races are in
services.escalations and docs/escalation.md."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Depends, Request

from notify_queue.api.auth import Auth
from notify_queue.api.body import Absent, read_json, storable_errors
from notify_queue.api.openapi import json_request, ok, problems
from notify_queue.api.query import reject_unknown_query_parameters
from notify_queue.api.responses import JsonResponse
from notify_queue.api.runtime import Runtime
from notify_queue.api.schemas import escalation_json
from notify_queue.errors import FieldError, ValidationFailed

_ESCALATION = "/escalations/{id}"


def add_escalation_routes(router: APIRouter, auth: Auth) -> None:
    client = [Depends(auth.client()), Depends(reject_unknown_query_parameters)]
    denied = auth.client_denials

    @router.get(
        _ESCALATION,
        tags=["escalations"],
        operation_id="getEscalation",
        summary="An escalation: its state and its steps",
        dependencies=client,
        responses={
            200: ok("Escalation", "The escalation."),
            **problems(400, *denied, 404, 503),
        },
    )
    async def get_escalation(id: uuid.UUID, runtime: Runtime) -> JsonResponse:
        return JsonResponse(escalation_json(await runtime.escalations.get(id)))

    @router.post(
        _ESCALATION + "/acknowledge",
        tags=["escalations"],
        operation_id="acknowledgeEscalation",
        summary="Acknowledge: every step not yet sent is cancelled (again: no change)",
        dependencies=client,
        openapi_extra=json_request("AcknowledgeRequest", required=False),
        responses={
            200: ok("Escalation", "Acknowledged (now or before)."),
            **problems(400, *denied, 404, 413, 415, 503),
        },
    )
    async def acknowledge_escalation(
        id: uuid.UUID, request: Request, runtime: Runtime
    ) -> JsonResponse:
        data = await read_json(request, required=False)
        by = None
        if data is not Absent.BODY and data is not None:
            if not isinstance(data, dict):
                raise ValidationFailed([FieldError("$", "must be a JSON object")])
            errors = storable_errors(data)
            errors += [FieldError(k, "Extra inputs are not permitted") for k in data if k != "by"]
            raw = data.get("by")
            if raw is not None and not isinstance(raw, str):
                errors.append(FieldError("by", "Input should be a valid string"))
            if errors:
                raise ValidationFailed(errors)
            by = raw
        escalation = await runtime.escalations.acknowledge(id, by=by)
        return JsonResponse(escalation_json(escalation))
