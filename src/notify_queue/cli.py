"""The `notify-queue` command: one program, several roles (CONTRACT section 2).

Flags are generated from `Settings`, so every option has exactly one definition, one default and
one description; each flag also reads its NOTIFY_QUEUE_* variable, and flags win. Expected
failures (bad settings, no database) print one line and exit non-zero, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import typing
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any

from notify_queue.errors import ConfigurationError, DatabaseUnavailable, NotifyQueueError
from notify_queue.logs import configure_logging
from notify_queue.settings import Settings, load_settings

COMMON = ["database_url", "log_format", "log_level", "database_pool_size", "database_timeout"]
API = ["host", "port", "api_token", "admin_token", "api_workers", "max_body_bytes", "max_attempts"]
POLICY = [
    "max_attempts",
    "backoff_base",
    "backoff_max",
    "rate_limit",
    "rate_limit_window",
    "webhook_url",
    "webhook_secret",
    "webhook_max_attempts",
    "webhook_backoff_base",
    "webhook_backoff_max",
    "webhook_timeout",
    "outbound_allow",
]
PROVIDERS = [
    "providers_file",
    "failover",
    "provider",
    "email_provider",
    "sms_provider",
    "push_provider",
    "sim_failure_rate",
    "sim_latency_ms",
    "provider_url",
    "provider_timeout",
    "smtp_host",
    "smtp_port",
    "smtp_username",
    "smtp_password",
    "smtp_starttls",
    "smtp_from",
]
WORKER = [
    "concurrency",
    "batch_size",
    "poll_interval",
    "lease_seconds",
    "priorities",
    "channels",
    "metrics_port",
    "shutdown_grace_seconds",
    "webhook_dispatch",
    *POLICY,
    *PROVIDERS,
]
OPERATOR = [
    "namespace",
    "status_batch_size",
    "status_patches_per_second",
    "scale_interval",
    "metrics_port",
    "host",
]

ROLES: dict[str, tuple[str, list[str]]] = {
    "migrate": (
        "create or upgrade the schema (safe to repeat, and from several processes)",
        COMMON,
    ),
    "api": ("run the HTTP API with /metrics", COMMON + API),
    "worker": ("claim, deliver and record notifications; dispatch webhooks", COMMON + WORKER),
    "relay": (
        "relay the webhook outbox only (workers then run with --webhook-dispatch off)",
        [
            *COMMON,
            "poll_interval",
            "metrics_port",
            "webhook_url",
            "webhook_secret",
            "webhook_max_attempts",
            "webhook_backoff_base",
            "webhook_backoff_max",
            "webhook_timeout",
            "outbound_allow",
        ],
    ),
    "operator": ("run the Kubernetes operator", COMMON + OPERATOR + POLICY),
    "up": (
        "everything on one machine: embedded PostgreSQL, migrate, API and a worker",
        [*COMMON, "data_dir", "kubernetes", *API, *WORKER],
    ),
}


def _flag_type(annotation: Any) -> Callable[[str], Any]:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    base = args[0] if args else annotation
    if base in (int, float):
        return typing.cast(Callable[[str], Any], base)
    return str  # strings, enums and lists are validated by Settings, with its messages


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="notify-queue",
        description="A notification queue (email, SMS, push) on PostgreSQL, run as a Kubernetes "
        "operator. "
        "Every option also reads NOTIFY_QUEUE_<OPTION>; flags win.",
    )
    roles = parser.add_subparsers(dest="role", required=True, metavar="ROLE")
    for role, (help_text, fields) in ROLES.items():
        sub = roles.add_parser(role, help=help_text, description=help_text)
        for name in dict.fromkeys(fields):
            info = Settings.model_fields[name]
            flag = "--" + name.replace("_", "-")
            default = info.get_default(call_default_factory=True)
            shown = (
                ",".join(map(str, default))
                if isinstance(default, list)
                else (default.value if isinstance(default, Enum) else default)
            )
            help_line = (
                f"{info.description} [{shown}]"
                if "secret" not in name and "token" not in name and "password" not in name
                else info.description
            )
            if info.annotation is bool:
                sub.add_argument(flag, dest=name, action="store_true", default=None, help=help_line)
            else:
                sub.add_argument(
                    flag,
                    dest=name,
                    type=_flag_type(info.annotation),
                    default=None,
                    help=help_line,
                    metavar=name.upper(),
                )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    role = args.role
    flags = {k: v for k, v in vars(args).items() if k != "role" and v is not None}
    try:
        settings = load_settings(**flags)
        configure_logging(settings.log_level, settings.log_format)
        return asyncio.run(_run(role, settings))
    except KeyboardInterrupt:
        return 130
    except ConfigurationError as exc:
        print(f"notify-queue {role}: configuration error: {exc}", file=sys.stderr)
        return 2
    except DatabaseUnavailable as exc:
        print(f"notify-queue {role}: {exc}", file=sys.stderr)
        return 1
    except NotifyQueueError as exc:
        print(f"notify-queue {role}: {exc}", file=sys.stderr)
        return 1


async def _run(role: str, settings: Settings) -> int:
    if role == "migrate":
        from notify_queue.repositories.db import Database
        from notify_queue.repositories.schema import migrate

        async with Database(
            settings.require_database_url(), pool_size=1, name="notify-queue-migrate"
        ) as db:
            applied = await migrate(db)
        print(f"schema up to date ({len(applied)} migrations applied)")
        return 0
    if role == "worker":
        from notify_queue.worker.main import run_worker

        await run_worker(settings)
        return 0
    if role == "relay":
        from notify_queue.worker.main import run_relay

        await run_relay(settings)
        return 0
    if role == "api":
        from notify_queue.api.main import run_api

        await run_api(settings)
        return 0
    if role == "operator":
        from notify_queue.operator.main import run_operator

        await run_operator(settings)
        return 0
    from notify_queue.up import run_up

    await run_up(settings)
    return 0
