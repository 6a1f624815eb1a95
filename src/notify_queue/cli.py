"""The `notify-queue` command: one program, several roles (docs/configuration.md).

Each role's flags are generated from its settings class (`notify_queue.settings`), group by
group, so every option has exactly one definition, one default and one description, and a
role offers only the options it reads: a flag of another role is refused with one line that
says which roles read it. Each flag also reads its NOTIFY_QUEUE_* variable, and flags win.
Expected failures (bad settings, no database) print one line and exit non-zero, never a
traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import typing
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any, NoReturn

from notify_queue import heap, tracing
from notify_queue.errors import ConfigurationError, DatabaseUnavailable, NotifyQueueError
from notify_queue.logs import configure_logging
from notify_queue.settings import (
    GROUPS,
    ROLE_SETTINGS,
    ApiSettings,
    DatabaseOptions,
    MigrateSettings,
    OperatorOptions,
    OperatorSettings,
    ProviderOptions,
    RelaySettings,
    UpSettings,
    WorkerSettings,
    load_settings,
)

ROLE_HELP: dict[str, str] = {
    "migrate": "create or upgrade the schema (safe to repeat, and from several processes)",
    "api": "run the HTTP API with /metrics",
    "worker": "claim, deliver and record notifications; relay webhook events unless "
    "--webhook-dispatch off",
    "relay": "relay the webhook outbox only (for workers started with --webhook-dispatch off)",
    "operator": "run the Kubernetes operator",
    "up": "everything on one machine: embedded PostgreSQL, migrate, the API and a worker "
    "(and with --kubernetes a local kube-apiserver and the operator)",
}
SECRET_WORDS = ("secret", "token", "password")
# The worker options a providers file replaces (--provider-timeout still bounds the session).
SINGLE_PROVIDER_FLAGS = frozenset(ProviderOptions.model_fields) - {
    "providers_file",
    "failover",
    "provider_timeout",
}


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit code 2), like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def roles_reading(field: str) -> list[str]:
    return [role for role, model in ROLE_SETTINGS.items() if field in model.model_fields]


def _flag_type(annotation: Any) -> Callable[[str], Any]:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    base = args[0] if args else annotation
    if base in (int, float):
        return typing.cast(Callable[[str], Any], base)
    return str  # strings, enums and lists are validated by the settings, with their messages


def _metavar(name: str, annotation: Any) -> str:
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation)
        if isinstance(item, type) and issubclass(item, Enum):
            return ",".join(str(member.value) for member in item)  # a comma-separated list
        return name.upper()
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    base = args[0] if args else annotation
    if isinstance(base, type) and issubclass(base, Enum):
        return "|".join(str(member.value) for member in base)
    return name.upper()


def _shown(default: object) -> object:
    if default is None:
        return "unset"
    if isinstance(default, list):
        return ",".join(str(getattr(v, "value", v)) for v in default)
    return default.value if isinstance(default, Enum) else default


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="notify-queue",
        description="A notification queue (email, SMS, push) on PostgreSQL, run as a Kubernetes "
        "operator. Every option also reads NOTIFY_QUEUE_<OPTION>; flags win. Each role takes "
        "only the options it reads: `notify-queue <role> --help`.",
        allow_abbrev=False,
    )
    roles = parser.add_subparsers(dest="role", required=True, metavar="ROLE")
    for role, model in ROLE_SETTINGS.items():
        sub = roles.add_parser(
            role, help=ROLE_HELP[role], description=ROLE_HELP[role], allow_abbrev=False
        )
        for group in GROUPS:
            fields = [f for f in group.model_fields if f in model.model_fields]
            if not fields:
                continue
            title, _, explanation = (group.__doc__ or "").strip().partition("\n")
            if role == "up" and group is OperatorOptions:
                title += " (read only with --kubernetes)"
            section = sub.add_argument_group(title, " ".join(explanation.split()) or None)
            for name in fields:
                _add_flag(section, name, model)
    return parser


def _add_flag(section: argparse._ArgumentGroup, name: str, model: type[DatabaseOptions]) -> None:
    info = model.model_fields[name]
    flag = "--" + name.replace("_", "-")
    help_line = info.description or ""
    if not any(word in name for word in SECRET_WORDS):
        help_line += f" [{_shown(info.get_default(call_default_factory=True))}]"
    if info.annotation is bool:
        section.add_argument(flag, dest=name, action="store_true", default=None, help=help_line)
    else:
        section.add_argument(
            flag,
            dest=name,
            type=_flag_type(info.annotation),
            default=None,
            help=help_line,
            metavar=_metavar(name, info.annotation),
        )


def _refusal(role: str, unknown: list[str]) -> str:
    """One line for arguments the role does not take, naming the roles that do read them."""
    parts = []
    for argument in unknown:
        if not argument.startswith("--"):
            continue
        field = argument[2:].partition("=")[0].replace("-", "_")
        readers = [r for r in roles_reading(field) if r != role]
        if readers:
            parts.append(
                f"{argument.partition('=')[0]} is not an option of {role} (read by: "
                f"{', '.join(readers)})"
            )
        else:
            parts.append(f"{argument.partition('=')[0]} is no option")
    if not parts:
        parts.append(f"unexpected arguments: {' '.join(unknown)}")
    return f"notify-queue {role}: {'; '.join(parts)} (see notify-queue {role} --help)"


def main(argv: Sequence[str] | None = None) -> int:
    args, unknown = build_parser().parse_known_args(argv)
    role = args.role
    if unknown:
        print(_refusal(role, unknown), file=sys.stderr)
        return 2
    flags = {k: v for k, v in vars(args).items() if k != "role" and v is not None}
    try:
        settings = load_settings(ROLE_SETTINGS[role], **flags)
        if isinstance(settings, UpSettings) and not settings.kubernetes:
            operator_only = [f for f in flags if f in OperatorOptions.model_fields]
            if operator_only:
                raise ConfigurationError(
                    [
                        f"--{f.replace('_', '-')} is read only with --kubernetes"
                        for f in operator_only
                    ]
                )
        if isinstance(settings, WorkerSettings) and settings.providers_file is not None:
            unread = [f for f in flags if f in SINGLE_PROVIDER_FLAGS]
            if unread:
                raise ConfigurationError(
                    [
                        f"--{f.replace('_', '-')} is not read with --providers-file (the file "
                        "defines the providers)"
                        for f in unread
                    ]
                )
        configure_logging(settings.log_level, settings.log_format)
        heap.enable()
        # Before any pool or HTTP session exists: the instrumentations patch their constructors.
        # Off (no OTEL_* exporter), nothing of OpenTelemetry's SDK is imported.
        tracing.configure(role)
        with asyncio.Runner(loop_factory=_loop_factory(role)) as runner:
            runner.run(_run(role, settings))
        return 0
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


def _loop_factory(role: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop for the API role: its event loop and socket handling cost about half of asyncio's
    per request, and the API is the one role whose every request is a handful of socket events.
    The other roles keep asyncio's own loop."""
    if role != "api":
        return None
    import uvloop

    return uvloop.new_event_loop


async def _run(role: str, settings: DatabaseOptions) -> None:
    # `up` is checked first: its settings are also each other role's.
    if isinstance(settings, UpSettings):
        from notify_queue.up import run_up

        await run_up(settings)
    elif isinstance(settings, MigrateSettings):
        from notify_queue.repositories.db import Database
        from notify_queue.repositories.schema import EnqueueDefaults, migrate

        # Through a transaction-mode pooler migrate's session-level lock would not hold: the
        # direct URL when there is one (docs/operations.md, "PgBouncer"), so `migrate` run in
        # any pod of the release, whose --database-url may be the pooler's, is safe.
        async with Database(
            settings.listen_database_url or settings.require_database_url(),
            pool_size=1,
            name="notify-queue-migrate",
            prepared_statements=settings.prepares_on_server,
        ) as db:
            defaults = EnqueueDefaults.configured(settings)
            applied = await migrate(db, contract=settings.contract, enqueue_defaults=defaults)
        print(f"schema up to date ({len(applied)} migrations applied)")
    elif isinstance(settings, WorkerSettings):
        from notify_queue.worker.main import run_worker

        await run_worker(settings)
    elif isinstance(settings, RelaySettings):
        from notify_queue.worker.main import run_relay

        await run_relay(settings)
    elif isinstance(settings, ApiSettings):
        from notify_queue.api.main import run_api

        await run_api(settings)
    elif isinstance(settings, OperatorSettings):
        from notify_queue.operator.main import run_operator

        await run_operator(settings)
