"""JSON answers written by orjson (`notify_queue.jsontext`): the same compact UTF-8 text as
Starlette's `JSONResponse`, in a fraction of its time (a batch's answer is 1,000 notifications)."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from notify_queue import jsontext


class JsonResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return jsontext.dumps(content)
