"""`/providers/{name}/events` (vendors' delivery receipts) and `/suppressions*` (docs/receipts.md).

The receipts route takes no API token: a vendor cannot send one. It is authenticated by the
provider's scheme instead, over the raw body, before a byte of it is parsed or stored: a request
that fails is 401 and changes nothing. The suppression list is the client's, behind its token.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from notify_queue.api.auth import Auth
from notify_queue.api.openapi import ok, problems
from notify_queue.api.query import reject_unknown_query_parameters
from notify_queue.api.runtime import Runtime
from notify_queue.api.schemas import rfc3339
from notify_queue.errors import FieldError, NotFound, ValidationFailed
from notify_queue.models import Channel
from notify_queue.providers.receipts import ReceiptInvalid, ReceiptRefused

log = logging.getLogger(__name__)

MAX_PAGE = 1000


def add_receipt_routes(router: APIRouter, auth: Auth) -> None:
    client = [Depends(auth.client()), Depends(reject_unknown_query_parameters)]
    denied = auth.client_denials

    @router.post(
        "/providers/{name}/events",
        tags=["receipts"],
        operation_id="postProviderEvents",
        summary="Delivery receipts from a provider's vendor, verified by its signature scheme",
        responses={
            200: ok("ReceiptsAccepted", "Verified and recorded (unknown message ids dropped)."),
            **problems(400, 401, 404, 413, 503),
        },
    )
    async def provider_events(name: str, request: Request, runtime: Runtime) -> JSONResponse:
        verifier = runtime.receipt_verifiers.get(name)
        if verifier is None:
            raise NotFound(f"provider {name!r} takes no receipts (--providers-file)")
        body = await request.body()
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        try:
            receipts = verifier.receipts(path=path, headers=request.headers, body=body)
        except ReceiptRefused as exc:
            # Said to the log, not the caller: a forger learns nothing about which check failed.
            log.warning("receipts for provider %s refused: %s", name, exc)
            raise HTTPException(
                401, "the request is not signed by this provider's vendor"
            ) from None
        except ReceiptInvalid as exc:
            raise HTTPException(400, f"signed, but not a receipt: {exc}") from None
        outcomes = await runtime.receipts.record(name, receipts)
        counter = runtime.metrics.receipts
        for outcome in outcomes:
            counter.labels(name, outcome.state if outcome.matched else "unknown").inc()
        return JSONResponse(
            {
                "received": len(outcomes),
                "matched": sum(o.matched for o in outcomes),
                "changed": sum(o.changed for o in outcomes),
            }
        )

    @router.get(
        "/suppressions",
        tags=["receipts"],
        operation_id="listSuppressions",
        summary="The suppression list: addresses that bounced for good or complained",
        dependencies=client,
        responses={200: ok("SuppressionPage", "A page."), **problems(400, *denied, 503)},
    )
    async def list_suppressions(
        runtime: Runtime,
        channel: Annotated[Channel | None, Query()] = None,
        address: Annotated[str | None, Query(min_length=1, max_length=320)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
        cursor: Annotated[
            str | None,
            Query(min_length=1, max_length=1024, description="`nextCursor` of the previous page."),
        ] = None,
    ) -> JSONResponse:
        items, next_cursor = await runtime.receipts.suppressions(
            channel=channel.value if channel else None, address=address, cursor=cursor, limit=limit
        )
        return JSONResponse(
            {
                "items": [
                    {
                        "channel": s.channel,
                        "address": s.address,
                        "reason": s.reason,
                        "at": rfc3339(s.at),
                        "notificationId": str(s.notification_id) if s.notification_id else None,
                    }
                    for s in items
                ],
                "nextCursor": next_cursor,
            }
        )

    @router.delete(
        "/suppressions/{channel}/{address}",
        tags=["receipts"],
        operation_id="deleteSuppression",
        summary="Take an address off the suppression list",
        status_code=204,
        dependencies=client,
        responses={204: {"description": "Removed."}, **problems(400, *denied, 404, 503)},
    )
    async def delete_suppression(channel: str, address: str, runtime: Runtime) -> Response:
        if channel not in {c.value for c in Channel}:
            raise ValidationFailed([FieldError("channel", f"unknown channel {channel!r}")])
        if not await runtime.receipts.unsuppress(channel=channel, address=address):
            raise NotFound(f"{channel} address {address!r} is not on the suppression list")
        return Response(status_code=204)
