"""Reading a JSON request body: media type (415), strict JSON (400), storable text (400).

The notification routes read the body themselves instead of letting FastAPI bind a model, for
two reasons: the idempotency hash is taken over the request *as sent* (docs/api-notes.md), and every
bad field, header and body alike, must be named in one 400. Parsing is strict: `NaN`,
`Infinity` and numbers that overflow a double are not JSON (RFC 8259), and PostgreSQL cannot
store NUL characters or unpaired surrogates, so those are named as bad fields here instead of
failing later in the driver. The size of the body was already bounded by `limits`. orjson parses
what it can read exactly, the standard library the rest (`notify_queue.jsontext`).
"""

from __future__ import annotations

import enum
import json
import math
from typing import Any

from fastapi import Request
from starlette.exceptions import HTTPException

from notify_queue import jsontext
from notify_queue.errors import FieldError, ValidationFailed

MAX_JSON_DEPTH = 32  # arrays and objects inside each other; metadata deeper than this is not data
_MAX_REPORTED = 100  # field errors named in one problem; a hostile body could name millions


def is_json_media_type(content_type: str | None) -> bool:
    if not content_type:
        return False
    media_type, _, params = content_type.partition(";")
    main, _, sub = media_type.strip().lower().partition("/")
    if main != "application" or not (sub == "json" or sub.endswith("+json")):
        return False
    for param in params.split(";"):
        name, _, value = param.strip().partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
        ):
            return False
    return True


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


class Absent(enum.Enum):
    """No body at all (as opposed to the JSON value `null`)."""

    BODY = enum.auto()


async def read_json(request: Request, *, required: bool) -> Any:
    """The body's JSON value; `Absent.BODY` when it is empty and not `required`."""
    if required and not is_json_media_type(request.headers.get("content-type")):
        raise _unsupported(request)
    raw = await request.body()
    if not raw and not required:
        return Absent.BODY
    if not is_json_media_type(request.headers.get("content-type")):
        raise _unsupported(request)
    if not raw:
        raise ValidationFailed([FieldError("$", "a JSON body is required")])
    try:
        return jsontext.loads(raw, fallback=_strict_loads)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError too
        message = (
            exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc) or "too deeply nested"
        )
        where = (
            f" at line {exc.lineno} column {exc.colno}"
            if isinstance(exc, json.JSONDecodeError)
            else ""
        )
        raise ValidationFailed([FieldError("$", f"malformed JSON: {message}{where}")]) from None


def _strict_loads(text: str) -> Any:
    """The standard library's parse, strict: the judge of every body orjson cannot read exactly
    (`jsontext`), so malformed JSON is named with the same message as it always was."""
    return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)


def _unsupported(request: Request) -> HTTPException:
    given = request.headers.get("content-type")
    sent = f"this request's Content-Type is {given[:100]}" if given else "it has none"
    return HTTPException(
        415, f"the body must be JSON: send `Content-Type: application/json` ({sent})"
    )


def storable_errors(value: Any, path: str = "") -> list[FieldError]:
    """Fields PostgreSQL could not store (NUL, unpaired surrogates) or nested too deeply."""
    errors: list[FieldError] = []
    _walk(value, path, 0, errors)
    return errors[:_MAX_REPORTED]


def _walk(value: Any, path: str, depth: int, errors: list[FieldError]) -> None:
    # A child's path is built only when it is named or descended into: most values are strings
    # that are fine, and building "a.b" for each of them cost more than checking it.
    if len(errors) >= _MAX_REPORTED:
        return
    if isinstance(value, str):
        problem = _text_problem(value)
        if problem:
            errors.append(FieldError(path or "$", problem))
    elif isinstance(value, dict | list):
        if depth >= MAX_JSON_DEPTH:
            errors.append(FieldError(path or "$", f"nests deeper than {MAX_JSON_DEPTH} levels"))
            return
        if isinstance(value, dict):
            for key, item in value.items():
                # The common text (ASCII without NUL) is settled here, in C, without a call.
                if not key.isascii() or "\x00" in key:
                    problem = _text_problem(key)
                    if problem:
                        errors.append(FieldError(_child(path, key), f"the key {problem}"))
                if type(item) is str:
                    if item.isascii() and "\x00" not in item:
                        continue
                    problem = _text_problem(item)
                    if problem and len(errors) < _MAX_REPORTED:
                        errors.append(FieldError(_child(path, key), problem))
                elif isinstance(item, dict | list | str):
                    _walk(item, _child(path, key), depth + 1, errors)
        else:
            for index, item in enumerate(value):
                if isinstance(item, dict | list | str):
                    _walk(item, f"{path}[{index}]", depth + 1, errors)


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "must not contain NUL characters"
    if text.isascii():
        return None  # no surrogates in ASCII; most text is, and this is cheaper than encoding
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode (no unpaired surrogates)"
    return None
