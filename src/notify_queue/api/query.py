"""Unknown query parameters are a 400, like unknown body fields.

A typo such as `?stauts=PENDING` would otherwise be ignored silently and list everything. The
known names are read from the route's own declared parameters, so the check never drifts from
the OpenAPI document.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from notify_queue.errors import FieldError, ValidationFailed


def _declared(dependant: Dependant) -> set[str]:
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _declared(sub)
    return names


async def reject_unknown_query_parameters(request: Request) -> None:
    if not request.scope.get("query_string"):
        return  # nothing to judge; the common case, and parsing an empty query is not free
    route = request.scope.get("route")
    known = _declared(route.dependant) if isinstance(route, APIRoute) else set()
    unknown = [name for name in dict.fromkeys(request.query_params) if name not in known]
    if unknown:
        raise ValidationFailed(
            [FieldError(name, "is not a query parameter here") for name in unknown]
        )
