"""Running the API role: one uvicorn server in this process, or `--api-workers` processes.

Every process is independent and shares nothing but the database (idempotency, pagination and
state changes are all decided there), so N workers behave as one. With more than one worker,
uvicorn's own supervisor spawns them; each imports `app_from_environment`, the app factory,
and reads its settings from the NOTIFY_QUEUE_* environment this process exports, the same
variables an operator would set by hand.
"""

from __future__ import annotations

import os
from enum import Enum

import uvicorn
from uvicorn.supervisors import Multiprocess

from notify_queue import heap, tracing
from notify_queue.api.app import create_app
from notify_queue.api.server import server_config
from notify_queue.logs import configure_logging
from notify_queue.settings import ApiSettings, load_settings

APP_FACTORY = "notify_queue.api.main:app_from_environment"


async def run_api(settings: ApiSettings) -> None:
    """Serve the API until SIGINT or SIGTERM."""
    settings.require_database_url()
    if settings.api_workers > 1:
        # uvicorn's process supervisor is synchronous and must own the main thread's signal
        # handlers; nothing else runs on this event loop, so blocking it here costs nothing.
        # This is `uvicorn.run` with the API's own server configuration (`server`).
        os.environ.update(settings_environment(settings))
        config = server_config(APP_FACTORY, settings, factory=True, workers=settings.api_workers)
        Multiprocess(config, sockets=[config.bind_socket()]).run()
        return
    await uvicorn.Server(server_config(create_app(settings), settings)).serve()


def app_from_environment() -> object:
    """The app factory each worker process imports (settings from NOTIFY_QUEUE_*)."""
    settings = load_settings(ApiSettings)
    configure_logging(settings.log_level, settings.log_format)
    heap.enable()
    tracing.configure("api")
    return create_app(settings)


def settings_environment(settings: ApiSettings) -> dict[str, str]:
    """Every set option as the NOTIFY_QUEUE_* variable that reproduces it."""
    env = {}
    for name, value in settings.model_dump().items():
        if value is not None:
            env[f"NOTIFY_QUEUE_{name.upper()}"] = _env_text(value)
    return env


def _env_text(value: object) -> str:
    if isinstance(value, list | tuple):
        return ",".join(_env_text(v) for v in value)
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)  # numbers, strings, paths
