"""Bearer-token authentication (docs/api-notes.md, "Authentication").

Two optional tokens: with `--api-token`, every `/notifications*` and `/status` call needs it
(401 otherwise); with `--admin-token` too, cancel and retry need the admin token (403 with the
client token). The admin token is also accepted wherever the client token is. Without tokens the
routes are open and the OpenAPI document declares no security. Tokens are compared in constant
time and never logged or echoed.

The token may also come in `X-Notify-Queue-Token` (the same token, wherever the bearer token is
accepted): the Kubernetes API server deletes the `Authorization` header of every request it
authenticates, so through its service proxy (`kubectl notify`, docs/kubectl-notify.md) a bearer
token never arrives. A bearer token, when present, is the one checked.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="bearerToken",
    description="`Authorization: Bearer <token>`: the API token, or the admin token where needed.",
)
# The kubectl plugin sends the same name (notify_queue.kubectl.api.TOKEN_HEADER).
TOKEN_HEADER = "X-Notify-Queue-Token"  # noqa: S105 - a header's name, not a token
_header = APIKeyHeader(
    name=TOKEN_HEADER,
    auto_error=False,
    scheme_name="tokenHeader",
    description="The same token as `Authorization: Bearer`, for clients behind a proxy that "
    "removes that header (the Kubernetes API server's service proxy).",
)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)]
HeaderToken = Annotated[str | None, Security(_header)]
Dependency = Callable[..., Awaitable[None]]


def _matches(given: str, token: str | None) -> bool:
    return token is not None and hmac.compare_digest(given.encode(), token.encode())


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(401, detail, headers={"WWW-Authenticate": "Bearer"})


def _no_token(authorization: str | None) -> HTTPException:
    """The 401 of a request without a token that counts, saying what to send instead. The
    header's value is never echoed: it may be the token itself, sent without its scheme."""
    scheme, _, rest = (authorization or "").strip().partition(" ")
    if not scheme:
        return _unauthorized("a bearer token is required")
    if not rest.strip():
        return _unauthorized(
            "the Authorization header has no scheme: send `Authorization: Bearer <token>`"
        )
    return _unauthorized("only Bearer tokens are accepted: send `Authorization: Bearer <token>`")


class Auth:
    def __init__(self, *, api_token: str | None, admin_token: str | None) -> None:
        self._api_token = api_token or None
        self._admin_token = admin_token or None

    @property
    def client_protected(self) -> bool:
        return self._api_token is not None

    @property
    def admin_protected(self) -> bool:
        return self._api_token is not None or self._admin_token is not None

    @property
    def client_denials(self) -> tuple[int, ...]:
        """The statuses the client dependency can answer, for the OpenAPI document."""
        return (401,) if self.client_protected else ()

    @property
    def admin_denials(self) -> tuple[int, ...]:
        """The statuses the admin dependency can answer: 403 needs a client token to refuse."""
        if self._api_token is not None and self._admin_token is not None:
            return (401, 403)
        return (401,) if self.admin_protected else ()

    def client(self) -> Dependency:
        """The dependency of `/notifications*` (read and create) and `/status`."""
        if not self.client_protected:
            return _open

        async def require_client(
            request: Request, credentials: Credentials, header: HeaderToken
        ) -> None:
            self._check_client(_given(credentials, header), request)

        return require_client

    async def check_client(self, request: Request) -> None:
        """The client dependency's check, for a route that is a plain Starlette endpoint (the
        create's fast lane, `routes_notifications`): the same header parsing, the same answers."""
        if self.client_protected:
            self._check_client(_given(await _bearer(request), await _header(request)), request)

    def _check_client(self, given: str | None, request: Request) -> None:
        if given is None:
            raise _no_token(request.headers.get("authorization"))
        if not (_matches(given, self._api_token) or _matches(given, self._admin_token)):
            raise _unauthorized("the bearer token is not valid")

    def admin(self) -> Dependency:
        """The dependency of cancel and retry."""
        if not self.admin_protected:
            return _open

        async def require_admin(
            request: Request, credentials: Credentials, header: HeaderToken
        ) -> None:
            given = _given(credentials, header)
            if given is None:
                raise _no_token(request.headers.get("authorization"))
            if self._admin_token is None:
                if not _matches(given, self._api_token):
                    raise _unauthorized("the bearer token is not valid")
                return
            if _matches(given, self._admin_token):
                return
            if _matches(given, self._api_token):
                raise HTTPException(403, "cancel and retry need the admin token")
            raise _unauthorized("the bearer token is not valid")

        return require_admin


def _given(credentials: HTTPAuthorizationCredentials | None, header: str | None) -> str | None:
    """The token the request carries: the bearer token, else the header's."""
    if credentials is not None:
        return credentials.credentials
    return header or None


async def _open() -> None:
    return None
