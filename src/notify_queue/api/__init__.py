"""The HTTP API (docs/api-reference.md): FastAPI routes over `services`, problem+json errors, /metrics.

`create_app(settings, db=...)` builds the ASGI app; `main.run_api(settings)` serves it.
"""

from notify_queue.api.app import create_app

__all__ = ["create_app"]
