"""The HTTP API: FastAPI routes over `services`, problem+json errors, /metrics.

The endpoints and their shapes are in docs/api-reference.md.

`create_app(settings, db=...)` builds the ASGI app; `main.run_api(settings)` serves it.
"""

from notify_queue.api.app import create_app

__all__ = ["create_app"]
