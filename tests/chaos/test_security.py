"""Security properties that hold for the whole code base, not one feature: secrets never reach
the logs, every SQL statement is parameterised, and the installed dependencies have no known
vulnerabilities (pip-audit).

The secrets test runs real processes at DEBUG level in both log formats through the paths that
log the most: provider failures, SMTP connection errors, failing webhooks, a database that is
not there, API calls with right and wrong tokens. The SQL test reads the source, so a new query
built with an f-string, `.format` or `%` fails it at once, wherever it is added.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import aiohttp
import pytest

from notify_queue.repositories.db import Database
from notify_queue.repositories.queries import QUERIES
from tests.chaos.harness import (
    WEBHOOK_SECRET,
    enqueue,
    new_notifications,
    poll,
    read_rows,
    worker_flags,
)
from tests.chaos.peers import ChaosProvider, SignedWebhookReceiver
from tests.support import free_port

SOURCE = Path(__file__).resolve().parents[2] / "src" / "notify_queue"
DB_PASSWORD = "db-pw-S3CR3T-7f3a"
HOOK_PASSWORD = "hook-pw-S3CR3T-91c2"
SMTP_PASSWORD = "smtp-pw-S3CR3T-55e0"
PROVIDER_TOKEN = "provider-token-S3CR3T-0b7d"
API_TOKEN = "api-token-S3CR3T-4c1e"
ADMIN_TOKEN = "admin-token-S3CR3T-a9d8"


def _with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    user = parts.username or "postgres"
    host = parts.hostname or ""
    netloc = f"{user}:{quote(password)}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _secrets() -> list[str]:
    # The whole secret and its key material alone (the part after whsec_).
    return [
        DB_PASSWORD,
        HOOK_PASSWORD,
        SMTP_PASSWORD,
        PROVIDER_TOKEN,
        API_TOKEN,
        ADMIN_TOKEN,
        WEBHOOK_SECRET,
        WEBHOOK_SECRET.removeprefix("whsec_"),
    ]


def _leaks(text: str) -> list[str]:
    return [s for s in _secrets() if s in text]


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_no_secret_reaches_the_logs_of_a_worker_or_the_api_even_at_debug_level(
    log_format: str,
    db: Database,
    database_url: str,
    provider: ChaosProvider,
    receiver: SignedWebhookReceiver,
    spawn,
) -> None:
    provider.failure_rate = 0.5
    receiver.answer_status = 500
    hook_url = receiver.url.replace("http://", f"http://hooks:{HOOK_PASSWORD}@")
    closed_port = free_port()  # nothing listens: every SMTP attempt is a connection error
    url = _with_password(database_url, DB_PASSWORD)
    procs = spawn(
        url,
        *worker_flags(
            provider,
            None,
            webhook_max_attempts=3,
            webhook_backoff_base=0.05,
            webhook_backoff_max=0.1,
            log_level="DEBUG",
            log_format=log_format,
        ),
        "--provider-url",
        f"{provider.url}?token={PROVIDER_TOKEN}",
        "--webhook-url",
        hook_url,
        "--webhook-secret",
        WEBHOOK_SECRET,
        "--email-provider",
        "smtp",
        "--smtp-host",
        "127.0.0.1",
        "--smtp-port",
        str(closed_port),
        "--smtp-username",
        "mailer",
        "--smtp-password",
        SMTP_PASSWORD,
    )
    worker = procs.start()
    api_port = free_port()
    api = procs.start_api(
        api_port,
        "--api-token",
        API_TOKEN,
        "--admin-token",
        ADMIN_TOKEN,
        "--log-level",
        "DEBUG",
        "--log-format",
        log_format,
    )
    await enqueue(db, new_notifications(60, tag=f"secrets-{log_format}"))

    async def settled() -> bool:
        rows = await read_rows(
            db, "SELECT count(*) AS n FROM nq_webhook_events WHERE state = 'failed'"
        )
        return rows[0]["n"] >= 60

    await poll(settled, timeout=60, what="every webhook failed after its attempts")
    async with aiohttp.ClientSession() as http:
        base = f"http://127.0.0.1:{api_port}"
        await poll(lambda: _answers(http, f"{base}/healthz"), timeout=30, what="API up")
        for token in (API_TOKEN, ADMIN_TOKEN, "wrong-token", f"{API_TOKEN}x"):
            headers = {"Authorization": f"Bearer {token}"}
            async with http.get(f"{base}/status", headers=headers):
                pass
            async with http.post(f"{base}/notifications/retry", headers=headers, json={}):
                pass
            async with http.post(f"{base}/notifications", headers=headers, data=b"{not json"):
                pass
    procs.terminate(worker)
    procs.terminate(api)
    assert await asyncio.to_thread(worker.wait, 20) == 0
    await asyncio.to_thread(api.wait, 20)

    logs = procs.all_logs()
    assert "webhook" in logs and "failed" in logs, "the failing paths were not exercised"
    assert _leaks(logs) == []
    stored = await read_rows(
        db,
        "SELECT last_error FROM nq_all_notifications WHERE last_error IS NOT NULL"
        " UNION ALL SELECT last_error FROM nq_webhook_events WHERE last_error IS NOT NULL",
    )
    assert stored and _leaks("\n".join(r["last_error"] for r in stored)) == []


def test_a_database_url_with_a_password_is_never_echoed_when_the_database_is_unreachable() -> None:
    url = f"postgresql://nq:{DB_PASSWORD}@127.0.0.1:9/nq"  # nothing listens on port 9
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda role: _run_briefly(role, url), ["worker", "migrate", "api"]))
    for result in results:
        assert result.stdout + result.stderr, "the failure was not reported at all"
        assert _leaks(result.stdout + result.stderr) == [], result.args


def _run_briefly(role: str, url: str) -> subprocess.CompletedProcess[str]:
    """Run `role` against an unreachable database. Worker and migrate exit with one line; the API
    starts anyway (it answers 503), so it is asked once for /readyz and then stopped."""
    args = [
        sys.executable,
        "-m",
        "notify_queue",
        role,
        "--database-url",
        url,
        "--log-level",
        "DEBUG",
    ]
    if role != "api":
        return subprocess.run(args, capture_output=True, text=True, timeout=90)
    port = free_port()
    proc = subprocess.Popen(
        [*args, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60  # generous: a busy machine starts a process slowly
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10)
                break
            except urllib.error.HTTPError:
                break  # it answered (503, as the database is away)
            except OSError:
                time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.terminate()
        out, err = proc.communicate(timeout=20)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


async def _answers(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url) as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


# --- SQL is always parameterised ----------------------------------------------------------------

_SQL = re.compile(
    r"\b(SELECT|INSERT\s+INTO|UPDATE|DELETE\s+FROM|LISTEN|NOTIFY|CREATE|ALTER|DROP|TRUNCATE|COPY)\b"
)
# The one statement built from text: LISTEN takes no parameters, and its channel is our constant.
_ALLOWED = {("repositories/db.py", "LISTEN {channel}")}


def _string_parts(node: ast.AST) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            v.value if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}"
            for v in node.values
            if isinstance(v, ast.Constant | ast.FormattedValue)
        )
    return ""


def _interpolated_sql(path: Path) -> list[str]:
    """Places where text that looks like SQL is built with an f-string, `.format`, `%` or `+`."""
    found = []
    relative = path.relative_to(SOURCE).as_posix()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        text = ""
        if isinstance(node, ast.JoinedStr) and any(
            isinstance(v, ast.FormattedValue) for v in node.values
        ):
            text = _string_parts(node)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "format"
        ):
            text = _string_parts(node.func.value)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod | ast.Add):
            sides = [node.left, node.right]
            if not all(isinstance(s, ast.Constant) for s in sides):
                text = " ".join(_string_parts(s) for s in sides)
        if text and _SQL.search(text) and (relative, text.strip()) not in _ALLOWED:
            found.append(f"{relative}:{getattr(node, 'lineno', '?')}: {text.strip()[:80]}")
    return found


def test_no_sql_statement_in_the_code_is_built_by_string_interpolation() -> None:
    files = sorted(SOURCE.rglob("*.py"))
    assert len(files) > 20
    problems = [p for f in files for p in _interpolated_sql(f)]
    assert problems == []


def test_the_scan_would_catch_each_kind_of_interpolation() -> None:
    """The scan itself is tested: each way of splicing a value into SQL is reported."""
    import tempfile

    bad = (
        'q1 = f"SELECT * FROM t WHERE id = {x}"\n'
        'q2 = "DELETE FROM t WHERE id = {}".format(x)\n'
        'q3 = "UPDATE t SET a = %s" % x\n'
        'q4 = "INSERT INTO t VALUES (" + x + ")"\n'
        'ok = "SELECT 1"\n'
    )
    with tempfile.TemporaryDirectory(dir=SOURCE) as tmp:
        path = Path(tmp) / "probe.py"
        path.write_text(bad)
        assert len(_interpolated_sql(path)) == 4


def test_every_repository_call_names_a_query_from_the_sql_files() -> None:
    """Repositories pass query names (constants found in sql/*.sql), never SQL text."""
    problems = []
    for path in sorted((SOURCE / "repositories").glob("*.py")):
        if path.name in ("db.py", "queries.py"):
            continue  # the connector seam and the loader
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("execute", "fetch_one", "fetch_all", "execute_on")
                and node.args
            ):
                first = node.args[0]
                if not (isinstance(first, ast.Constant) and first.value in QUERIES):
                    problems.append(f"{path.name}:{node.lineno}: {ast.unparse(first)[:60]}")
    assert problems == []


def _identifier_queries() -> set[str]:
    """The queries the repositories run with `execute_on` (identifiers quoted by the driver)."""
    names = set()
    for path in sorted((SOURCE / "repositories").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "execute_on"
            ):
                first = node.args[0]
                names |= {first.value} if isinstance(first, ast.Constant) else set()
    return names


_IDENTIFIER_QUERIES = _identifier_queries()


def test_the_sql_files_use_only_named_driver_parameters() -> None:
    problems = []
    for path in sorted((SOURCE / "repositories").rglob("*.sql")):
        text = path.read_text(encoding="utf-8")
        # Strip comments, then every %(name)s, %(name)b (binary: the arrays) and %%: no other %
        # may remain.
        code = re.sub(r"--[^\n]*", "", text)
        rest = re.sub(r"%\(\w+\)[sb]|%%", "", code)
        if "%" in rest:
            problems.append(f"{path.name}: a % that is not %(name)s or %(name)b")
        # {name} is allowed only in queries run through Connection.execute_on, which fills it
        # with psycopg.sql.Identifier (a partition to detach): never str.format.
        for name, query in re.findall(r"-- name: (\w+)\n(.*?)(?=\n-- name: |\Z)", code, re.S):
            if re.search(r"\{[A-Za-z_]\w*\}", query) and name not in _IDENTIFIER_QUERIES:
                problems.append(f"{path.name}: a {{name}} placeholder meant for str.format")
    assert problems == []


# --- dependencies ---------------------------------------------------------------------------------


def test_the_installed_dependencies_have_no_known_vulnerabilities() -> None:
    """pip-audit over the virtualenv. It needs an advisory service (PyPI's JSON API or OSV); where
    neither answers, pip-audit "passes" having audited nothing, so this test skips instead."""
    if shutil.which("pip-audit", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("pip-audit is not installed: .venv/bin/pip install pip-audit")
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "pip-audit"),
            "--skip-editable",
            "--format",
            "json",
            "--progress-spinner",
            "off",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        report = json.loads(result.stdout)
    except ValueError:
        pytest.skip(
            f"pip-audit could not reach an advisory service: {result.stderr.strip()[-300:]}"
        )
    dependencies = report["dependencies"]
    audited = [d for d in dependencies if "skip_reason" not in d]
    if not audited:
        reason = dependencies[0]["skip_reason"] if dependencies else "no dependencies listed"
        pytest.skip(
            f"pip-audit audited none of {len(dependencies)} packages (e.g. {reason!r}): the "
            "advisory service is not reachable from here; run `pip-audit` where PyPI's JSON API is"
        )
    vulnerable = {d["name"]: [v["id"] for v in d["vulns"]] for d in audited if d["vulns"]}
    assert vulnerable == {}
