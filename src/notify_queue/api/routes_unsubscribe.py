"""`/unsubscribe/{token}`: one-click unsubscribe (RFC 8058; docs/receipts.md).

No API token: the link is the credential. `POST` is what mail clients send for one click
(`List-Unsubscribe=One-Click` in the body, which is not needed to act); `GET` is what a person
who opens the link sees, a page with one button that makes the same POST, so that a link
scanner that fetches every URL in a mail unsubscribes nobody. A forged or altered token is 404,
as is one whose recipient is gone.
"""

from __future__ import annotations

import html

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from notify_queue.api.openapi import problems
from notify_queue.api.runtime import Runtime
from notify_queue.errors import NotFound
from notify_queue.services.unsubscribe import Unsubscribe, verify_token

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Unsubscribe</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body><form method="post">
<p>Stop receiving <strong>{category}</strong> email?</p>
<button type="submit" name="List-Unsubscribe" value="One-Click">Unsubscribe</button>
</form></body></html>
"""
_DONE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Unsubscribed</title></head>
<body><p>You will no longer receive <strong>{category}</strong> email.</p></body></html>
"""


def add_unsubscribe_routes(router: APIRouter, secrets: tuple[str, ...]) -> None:
    def verified(token: str) -> Unsubscribe:
        found = verify_token(secrets, token) if secrets else None
        if found is None:
            raise NotFound("no such unsubscribe link")
        return found

    @router.get(
        "/unsubscribe/{token}",
        tags=["unsubscribe"],
        operation_id="getUnsubscribe",
        summary="The page of an unsubscribe link: one button",
        response_class=HTMLResponse,
        responses={200: {"description": "The page."}, **problems(404)},
    )
    async def unsubscribe_page(token: str) -> HTMLResponse:
        found = verified(token)
        return HTMLResponse(_PAGE.format(category=html.escape(found.category)))

    @router.post(
        "/unsubscribe/{token}",
        tags=["unsubscribe"],
        operation_id="postUnsubscribe",
        summary="Opt the link's recipient out of its category (RFC 8058 one-click)",
        responses={200: {"description": "Opted out."}, **problems(404, 503)},
    )
    async def unsubscribe(token: str, runtime: Runtime) -> HTMLResponse:
        found = verified(token)
        await runtime.recipients.opt_out_category(found.recipient_id, found.category)
        return HTMLResponse(_DONE.format(category=html.escape(found.category)))
