"""Each role of the real `notify-queue` program takes exactly the options it reads.

Every test runs the installed command line as a subprocess, as a person or a pod would: a flag
of another role stops a role at once with one line naming the roles that do read it; `--help`
lists only the role's own options; variables of other roles are ignored (one ConfigMap serves
every role), while a role's own bad variable still stops it; a worker refuses to start when a
channel it serves has no provider able to deliver it; and `relay` relays the webhooks of workers
started with `--webhook-dispatch off`.
"""

from __future__ import annotations

import email.policy
import os
import platform
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from notify_queue.models import Channel, Status
from notify_queue.repositories.db import Database
from notify_queue.settings import ROLE_SETTINGS, WorkerSettings
from tests.receivers import WebhookReceiver
from tests.support import eventually, new, notification_service

COMMAND = [sys.executable, "-m", "notify_queue"]


def _environment(**variables: str) -> dict[str, str]:
    """This process's environment without any NOTIFY_QUEUE_* variable, plus `variables`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFY_QUEUE_")}
    return env | variables


def run(*args: str, timeout: float = 60, **variables: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *args],
        env=_environment(**variables),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def flags_in_help(role: str) -> set[str]:
    result = run(role, "--help")
    assert result.returncode == 0, result.stderr
    # Option lines only: "  --flag [METAVAR]" then the help text (or the end of the line).
    option = re.compile(r"^  (--[a-z][a-z-]+)(?: [A-Za-z_|,]+)?(?:\s{2,}|$)", re.MULTILINE)
    return set(option.findall(result.stdout)) - {"--help"}


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got:\n{text}"
    assert "Traceback" not in text
    return lines[0]


# --- what each role offers -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "flag", "readers"),
    [
        ("worker", "--max-attempts", "migrate, api, operator"),  # fixed when one is created
        ("operator", "--rate-limit", "worker"),
        ("operator", "--backoff-base", "worker"),
        ("operator", "--webhook-secret", "worker, relay"),
        ("operator", "--webhook-max-attempts", "worker, relay"),
        ("api", "--provider", "worker"),
        ("api", "--concurrency", "worker"),
        ("relay", "--provider-url", "worker"),
        ("relay", "--concurrency", "worker"),
        ("migrate", "--host", "api, worker, relay, operator"),
        ("worker", "--namespace", "operator"),
    ],
)
def test_a_flag_the_role_does_not_read_stops_it_with_one_line_naming_who_reads_it(
    role: str, flag: str, readers: str
) -> None:
    result = run(role, flag, "1", "--database-url", "postgresql://nobody@127.0.0.1:1/none")

    assert result.returncode == 2
    line = one_line(result.stderr)
    assert f"{flag} is not an option of {role}" in line
    assert f"read by: {readers}" in line


def test_an_unknown_flag_is_refused_as_no_option_at_all() -> None:
    result = run("worker", "--max-attempt", "3")  # no abbreviations either

    assert result.returncode == 2
    assert "--max-attempt is no option" in one_line(result.stderr)


def test_up_refuses_operator_flags_without_kubernetes() -> None:
    result = run("up", "--namespace", "shop")

    assert result.returncode == 2
    assert "--namespace is read only with --kubernetes" in one_line(result.stderr)


@pytest.mark.parametrize("role", list(ROLE_SETTINGS))
def test_help_lists_exactly_the_options_the_role_reads(role: str) -> None:
    expected = {"--" + f.replace("_", "-") for f in ROLE_SETTINGS[role].model_fields}

    assert flags_in_help(role) == expected


def test_the_options_of_each_role_are_the_ones_its_code_reads() -> None:
    worker, operator, relay, api = (
        flags_in_help(r) for r in ("worker", "operator", "relay", "api")
    )
    # The flags issue 14 found accepted and ignored.
    assert "--max-attempts" not in worker
    # The operator and the API create notifications, and one suppressed at creation (issue 12)
    # gets its event there, so they read --webhook-url, and no other webhook option.
    assert not {f for f in operator if f.startswith(("--rate-limit", "--backoff"))}
    assert {f for f in operator | api if f.startswith("--webhook")} == {"--webhook-url"}
    # The relay POSTs stored events: webhook options (--webhook-url tells the installer's own
    # endpoint from client URLs), the guard, polling and metrics only, and the direct
    # connection its LISTEN for new events needs behind a transaction-mode pooler.
    assert relay == {
        "--database-url",
        "--listen-database-url",
        "--log-format",
        "--log-level",
        "--database-pool-size",
        "--database-prepared-statements",
        "--host",
        "--metrics-port",
        "--poll-interval",
        "--webhook-url",
        "--webhook-secret",
        "--webhook-max-attempts",
        "--webhook-backoff-base",
        "--webhook-backoff-max",
        "--webhook-timeout",
        "--outbound-allow",
    }
    assert "--webhook-dispatch" in worker and "--webhook-dispatch" not in relay
    # A separate direct URL only where something needs a session: workers (LISTEN for new work),
    # the relay (new webhook events), the operator (the status outbox) and migrate (its advisory
    # lock); the API only NOTIFYs.
    listens = {r for r in ROLE_SETTINGS if "--listen-database-url" in flags_in_help(r)}
    assert listens == {"worker", "relay", "operator", "migrate", "up"}
    # The API reads the providers file for the receipts' verifiers only; no provider option.
    assert {f for f in api if f.startswith(("--provider", "--smtp"))} == {"--providers-file"}
    assert flags_in_help("up") == api | worker | operator | {"--data-dir", "--kubernetes"}


def test_a_worker_claims_as_many_as_its_concurrency_unless_told_otherwise() -> None:
    worker = WorkerSettings
    assert worker(database_url="postgresql:///x").claim_size == 256  # --concurrency's default
    assert worker(database_url="postgresql:///x", concurrency=64).claim_size == 64
    # One claim's row locks last its transaction: never more than 1,000 rows.
    assert worker(database_url="postgresql:///x", concurrency=5000).claim_size == 1000
    assert worker(database_url="postgresql:///x", batch_size=100).claim_size == 100


# --- providers per channel -------------------------------------------------------------------


def test_a_worker_refuses_to_start_when_smtp_would_have_to_deliver_sms_and_push() -> None:
    result = run(
        "worker",
        "--provider",
        "smtp",
        "--smtp-host",
        "127.0.0.1",
        NOTIFY_QUEUE_DATABASE_URL="postgresql://nobody@127.0.0.1:1/none",
    )

    assert result.returncode == 2
    line = one_line(result.stderr)
    assert "the smtp provider cannot deliver sms" in line
    assert "the smtp provider cannot deliver push" in line


def test_a_worker_without_channels_serves_voice_which_smtp_as_its_provider_cannot() -> None:
    result = run(
        "worker",
        "--provider",
        "smtp",
        "--smtp-host",
        "127.0.0.1",
        "--sms-provider",
        "http",
        "--push-provider",
        "http",
        "--provider-url",
        "http://127.0.0.1:1/send",
        NOTIFY_QUEUE_DATABASE_URL="postgresql://nobody@127.0.0.1:1/none",
    )

    assert result.returncode == 2
    # Voice has no --voice-provider: the message names the flag that exists.
    assert one_line(result.stderr).endswith(
        "the smtp provider cannot deliver voice: set --provider, or leave it out of --channels"
    )


def test_a_worker_refuses_an_http_provider_without_url_only_for_channels_it_serves() -> None:
    result = run(
        "worker",
        "--sms-provider",
        "http",
        NOTIFY_QUEUE_DATABASE_URL="postgresql://nobody@127.0.0.1:1/none",
    )
    assert result.returncode == 2
    assert "the http provider needs --provider-url" in one_line(result.stderr)


def test_a_worker_with_a_providers_file_refuses_the_single_provider_flags(tmp_path: Path) -> None:
    providers = tmp_path / "providers.yaml"
    providers.write_text("providers: []\n")

    result = run(
        "worker",
        "--providers-file",
        str(providers),
        "--provider-url",
        "http://gateway/send",
        NOTIFY_QUEUE_DATABASE_URL="postgresql://nobody@127.0.0.1:1/none",
    )

    assert result.returncode == 2
    assert "--provider-url is not read with --providers-file" in one_line(result.stderr)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def start(
    processes: list[subprocess.Popen[str]], log: Path, *args: str, **variables: str
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [*COMMAND, *args],
        env=_environment(**variables),
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        text=True,
    )
    processes.append(proc)
    return proc


async def wait_for_log(proc: subprocess.Popen[str], log: Path, text: str) -> None:
    async def logged() -> bool:
        assert proc.poll() is None, f"exited {proc.returncode}:\n{log.read_text()}"
        return text in log.read_text()

    await eventually(logged, timeout=30, what=f"{text!r} in the log")


def stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=30)


async def test_an_smtp_worker_for_email_only_starts(
    database_url: str, processes: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    worker = start(
        processes,
        log,
        "worker",
        "--provider",
        "smtp",
        "--smtp-host",
        "127.0.0.1",
        "--channels",
        "email",
        NOTIFY_QUEUE_DATABASE_URL=database_url,
    )

    await wait_for_log(worker, log, "worker started")
    assert stop(worker) == 0
    # One line, on a Python whose email package does not refuse a broken header while writing.
    warnings = [line for line in log.read_text().splitlines() if "CVE-2024-6923" in line]
    if hasattr(email.policy.default, "verify_generated_headers"):
        assert warnings == []
    else:
        [line] = warnings
        assert "WARNING" in line and f"Python {platform.python_version()}" in line


# --- one environment for every role ----------------------------------------------------------

# Variables that would stop the role that reads them; none is the API's or migrate's.
OTHER_ROLES_VARIABLES = {
    "NOTIFY_QUEUE_PROVIDER": "http",  # a worker would need --provider-url
    "NOTIFY_QUEUE_BACKOFF_BASE": "100",  # a worker: more than --backoff-max
    "NOTIFY_QUEUE_WEBHOOK_SECRET": "not-a-whsec",  # a worker or relay: malformed
    "NOTIFY_QUEUE_NAMESPACE": "shop",
    "NOTIFY_QUEUE_SCALE_INTERVAL": "-1",  # the operator: must be > 0
}


async def test_the_api_ignores_the_variables_of_other_roles(
    database_url: str, processes: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "api.log"
    api = start(
        processes,
        log,
        "api",
        "--port",
        str(port),
        NOTIFY_QUEUE_DATABASE_URL=database_url,
        NOTIFY_QUEUE_LOG_LEVEL="INFO",
        **OTHER_ROLES_VARIABLES,
    )

    async def healthy() -> bool:
        assert api.poll() is None, log.read_text()
        try:
            async with httpx.AsyncClient() as client:
                return (await client.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200
        except httpx.TransportError:
            return False

    await eventually(healthy, timeout=30, what="the API ready")
    # uvicorn ends by re-raising the SIGTERM it handled, once it has shut down cleanly.
    assert stop(api) in (0, -signal.SIGTERM)


def test_migrate_ignores_the_variables_of_other_roles(database_url: str) -> None:
    result = run("migrate", NOTIFY_QUEUE_DATABASE_URL=database_url, **OTHER_ROLES_VARIABLES)

    assert result.returncode == 0, result.stderr
    assert "schema up to date" in result.stdout


def test_migrate_takes_the_direct_url_when_the_database_url_is_a_pooler(database_url: str) -> None:
    # The chart's pods have the pooler as NOTIFY_QUEUE_DATABASE_URL and the direct connection as
    # NOTIFY_QUEUE_LISTEN_DATABASE_URL: `kubectl exec ... -- notify-queue migrate --contract` in
    # any of them must take the direct one (its advisory lock needs a session). A pooler that
    # answers nothing stands in for one that would break the lock.
    result = run(
        "migrate",
        NOTIFY_QUEUE_DATABASE_URL="postgresql://nobody@127.0.0.1:1/pooler",
        NOTIFY_QUEUE_LISTEN_DATABASE_URL=database_url,
    )

    assert result.returncode == 0, result.stderr
    assert "schema up to date" in result.stdout


def test_a_role_still_refuses_its_own_bad_variable() -> None:
    result = run(
        "worker",
        NOTIFY_QUEUE_DATABASE_URL="postgresql://nobody@127.0.0.1:1/none",
        NOTIFY_QUEUE_BACKOFF_BASE="100",
    )

    assert result.returncode == 2
    assert "--backoff-base must not exceed --backoff-max" in one_line(result.stderr)


# --- relay -----------------------------------------------------------------------------------


async def test_relay_posts_the_webhooks_of_workers_that_do_not_dispatch(
    database_url: str, db: Database, processes: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    receiver = await WebhookReceiver().start()
    try:
        common = {"NOTIFY_QUEUE_DATABASE_URL": database_url, "NOTIFY_QUEUE_POLL_INTERVAL": "0.2"}
        worker_log = tmp_path / "worker.log"
        worker = start(
            processes,
            worker_log,
            "worker",
            "--webhook-dispatch",
            "off",
            "--webhook-url",
            receiver.url,
            **common,
        )
        await wait_for_log(worker, worker_log, "worker started")
        service = notification_service(db)
        created = (await service.enqueue(new(channel=Channel.EMAIL))).notification

        async def sent() -> bool:
            return (await service.get(created.id)).status is Status.SENT

        await eventually(sent, timeout=30, what="the notification SENT")
        assert receiver.received == []  # the worker stored the event and did not POST it

        relay_log = tmp_path / "relay.log"
        relay = start(processes, relay_log, "relay", "--outbound-allow", "127.0.0.1/32", **common)

        async def posted() -> bool:
            assert relay.poll() is None, relay_log.read_text()
            return bool(receiver.received)

        await eventually(posted, timeout=30, what="the webhook POSTed by the relay")
        (event,) = [r.json for r in receiver.received]
        assert event["jobId"] == str(created.id) and event["status"] == "SENT"
        assert stop(relay) == 0
        assert stop(worker) == 0
    finally:
        await receiver.stop()
