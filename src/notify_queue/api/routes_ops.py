"""Operations: `/status` (queue figures as JSON), `/metrics` (the same for Prometheus),
`/healthz` (the process answers) and `/readyz` (the database answers and its schema is the one
this code needs: a load balancer sends no traffic to a replica that would only answer 503).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from notify_queue.api.auth import Auth
from notify_queue.api.openapi import ok, problems
from notify_queue.api.query import reject_unknown_query_parameters
from notify_queue.api.runtime import Runtime
from notify_queue.api.schemas import QueueStatus
from notify_queue.errors import SchemaNotCurrent


def add_ops_routes(router: APIRouter, auth: Auth) -> None:

    @router.get(
        "/status",
        tags=["operations"],
        operation_id="getStatus",
        summary="Counts per status, due per priority, the oldest due age",
        dependencies=[Depends(auth.client()), Depends(reject_unknown_query_parameters)],
        responses={
            200: ok("QueueStatus", "The queue now."),
            **problems(400, *auth.client_denials, 503),
        },
    )
    async def status(runtime: Runtime) -> JSONResponse:
        snapshot = await runtime.service.status()
        return JSONResponse(QueueStatus.of(snapshot).model_dump(mode="json", by_alias=True))

    @router.get(
        "/metrics",
        tags=["operations"],
        operation_id="getMetrics",
        dependencies=[Depends(reject_unknown_query_parameters)],
        summary="Prometheus metrics (global figures read from the database, at most "
        "--metrics-refresh-seconds old)",
        responses={
            200: {
                "description": "Prometheus text format; OpenMetrics when the Accept header asks.",
                "content": {
                    "text/plain": {"schema": {"type": "string"}},
                    "application/openmetrics-text": {"schema": {"type": "string"}},
                },
            },
            **problems(400, 503),
        },
    )
    async def metrics(request: Request, runtime: Runtime) -> Response:
        snapshot = await runtime.metrics_status.get()
        text, media_type = runtime.metrics.render(snapshot, accept=request.headers.get("accept"))
        return Response(text, media_type=media_type)

    @router.get(
        "/healthz",
        tags=["operations"],
        operation_id="getHealth",
        dependencies=[Depends(reject_unknown_query_parameters)],
        summary="Liveness: the process answers",
        responses={200: ok("Health", "Alive."), **problems(400)},
    )
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @router.get(
        "/readyz",
        tags=["operations"],
        operation_id="getReadiness",
        dependencies=[Depends(reject_unknown_query_parameters)],
        summary="Readiness: the database answers and the schema is current",
        responses={200: ok("Readiness", "Ready."), **problems(400, 503)},
    )
    async def readyz(runtime: Runtime) -> JSONResponse:
        # Ready when every step this release needs is applied, newer ones or not: during the
        # next release's roll-out its `migrate` runs first, and this pod must stay in service.
        missing = await runtime.missing_schema_steps()
        if missing:
            raise SchemaNotCurrent(
                f"the database schema lacks {', '.join(missing)}; run `notify-queue migrate`"
            )
        version = await runtime.schema_version()
        return JSONResponse({"status": "ready", "schemaVersion": version})
