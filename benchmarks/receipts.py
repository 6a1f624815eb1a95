"""Delivery receipts through one API process (docs/receipts.md, docs/performance.md "Delivery
receipts").

    python -m benchmarks.receipts [--receipts N] [--clients C]

A fresh embedded PostgreSQL and database: `notify-queue migrate`, N SENT notifications written
straight into the delivery log (provider `hooks` and `sg`, message ids `pm-<i>`), and one real
`notify-queue api` process reading a providers file with an `http` (Standard Webhooks) and a
`sendgrid` (ECDSA) provider. Two runs, each of N receipts from C keep-alive clients
(`benchmarks.httpload`), every request signed beforehand so the clients spend nothing on it:

- `single`: one Standard Webhooks receipt per request (`delivered`);
- `batch100`: SendGrid-style batches of 100 events per request.

Each run prints receipts per second, the API process's CPU per receipt, and the PostgreSQL cost
per receipt counted as the cost benchmark counts it for notifications (benchmarks/dbcost.py:
CPU, WAL, row versions, statements); figures go to `benchmarks/results/receipts/<timestamp>.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from benchmarks import alternating, dbcost, queue
from benchmarks.burn import cpu_seconds
from benchmarks.env import BenchPostgres, fresh_postgres
from benchmarks.httpload import request_bytes, run_load
from benchmarks.scenarios.ingest import _free_port, _wait_ready

RESULTS = Path(__file__).parent / "results" / "receipts"
WHSEC = "whsec_" + base64.b64encode(b"benchmark receipts secret 32 b!!").decode()
BATCH = 100

# SENT rows as a completion leaves them in the log (the columns a receipt reads).
_SEED = """
INSERT INTO nq_delivery_log (id, idempotency_key, request_hash, channel, recipient, body,
                             priority, status, send_at, next_attempt_at, max_attempts, sent_at,
                             finished_at, provider, provider_message_id)
SELECT gen_random_uuid(), 'k-' || p.name || '-' || i, 'h', 'email', 'r' || i || '@example.com',
       'x', 1, 'SENT', now(), now(), 6, now(), now(), p.name, 'pm-' || i
FROM generate_series(1, %(n)s) AS i, (VALUES ('hooks'), ('sg')) AS p(name)
"""


def _standard_webhooks(body: bytes, i: int) -> dict[str, str]:
    msg_id, timestamp = f"msg_{i}", str(int(time.time()))
    key = base64.b64decode(WHSEC.removeprefix("whsec_"))
    signed = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": timestamp,
        "webhook-signature": "v1," + base64.b64encode(signed).decode(),
    }


def single_requests(n: int) -> list[bytes]:
    out = []
    for i in range(1, n + 1):
        body = json.dumps({"providerMessageId": f"pm-{i}", "event": "delivered"}).encode()
        out.append(
            request_bytes("POST", "/providers/hooks/events", body, _standard_webhooks(body, i))
        )
    return out


def batch_requests(n: int, key: ec.EllipticCurvePrivateKey) -> list[bytes]:
    out = []
    now = int(time.time())
    for start in range(1, n + 1, BATCH):
        events = [
            {
                "email": f"r{i}@example.com",
                "timestamp": now,
                "event": "delivered",
                "sg_message_id": f"pm-{i}.filterdrecv-1",
            }
            for i in range(start, min(start + BATCH, n + 1))
        ]
        body = json.dumps(events).encode()
        timestamp = str(int(time.time()))
        signature = key.sign(timestamp.encode() + body, ec.ECDSA(hashes.SHA256()))
        headers = {
            "X-Twilio-Email-Event-Webhook-Signature": base64.b64encode(signature).decode(),
            "X-Twilio-Email-Event-Webhook-Timestamp": timestamp,
        }
        out.append(request_bytes("POST", "/providers/sg/events", body, headers))
    return out


def providers_file(where: Path, key: ec.EllipticCurvePrivateKey) -> Path:
    (where / "whsec").write_text(WHSEC)
    pem = where / "sg.pem"
    pem.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    path = where / "providers.yaml"
    path.write_text(
        "providers:\n"
        "  - {name: hooks, type: simulated, channels: [email],\n"
        f"     receipts: {{scheme: http, secretFrom: {{file: {where / 'whsec'}}}}}}}\n"
        "  - {name: sg, type: simulated, channels: [email],\n"
        f"     receipts: {{scheme: sendgrid, publicKeyFile: {pem}}}}}\n"
    )
    return path


def one_run(pg: BenchPostgres, where: Path, mode: str, n: int, clients: int) -> dict[str, Any]:
    name = pg.database(f"receipts_{mode}")
    url = pg.url(name)
    dbcost.prepare_database(pg.url(), name)
    queue.migrate(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT nq_delivery_log_prepare(1)")
        conn.execute(_SEED, {"n": n})
        conn.execute("ANALYZE nq_delivery_log")
    key = ec.generate_private_key(ec.SECP256R1())
    providers = providers_file(where, key)
    requests = single_requests(n) if mode == "single" else batch_requests(n, key)
    port = _free_port()
    log = (where / f"api-{mode}.log").open("wb")
    api = subprocess.Popen(
        [
            *(sys.executable, "-m", "notify_queue", "api", "--database-url", url),
            *("--port", str(port), "--providers-file", str(providers), "--log-level", "WARNING"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    assert pg.server.pid is not None
    observer = dbcost.Observer(url, pg.server.pid)
    try:
        asyncio.run(_wait_ready(f"http://127.0.0.1:{port}", timeout=120))
        before = observer.snapshot()
        api_before = cpu_seconds([api.pid])
        result = asyncio.run(run_load("127.0.0.1", port, requests, clients=clients))
        # The API's CPU for the load: what carries over from a machine shared with other work
        # (a rate measured there is the share of the cores it got).
        api_cpu = cpu_seconds([api.pid]) - api_before
        api.terminate()
        api.wait(30)
        observer.wait_for_backends_gone()
        after = observer.snapshot()
        phase = observer.diff(mode, before, after)
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT count(*) FROM nq_delivery_receipts").fetchone()
        recorded = int(row[0]) if row else 0
    finally:
        if api.poll() is None:
            api.kill()
        log.close()
        observer.close()
    return {
        "mode": mode,
        "receipts": n,
        "requests": len(requests),
        "clients": clients,
        "statuses": result.statuses,
        "recorded": recorded,
        "seconds": round(result.seconds, 2),
        "receipts_per_second": round(n / result.seconds, 1),
        "per_receipt": dbcost.per_unit(phase, n),
        "api_cpu_us_per_receipt": round(api_cpu * 1e6 / n, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--receipts", type=int, default=20_000)
    parser.add_argument("--clients", type=int, default=32)
    args = parser.parse_args()
    runs = []
    with fresh_postgres("receipts") as pg:
        dbcost.prepare_server(pg.url())
        for mode in ("single", "batch100"):
            run = one_run(pg, pg.workdir, mode, args.receipts, args.clients)
            cost = run["per_receipt"]
            print(
                f"{mode:9} {run['receipts_per_second']:>9,.0f} receipts/s  "
                f"({run['requests']} requests, {run['statuses']}, {run['recorded']} recorded)  "
                f"API per receipt: {run['api_cpu_us_per_receipt']} us CPU; "
                f"PostgreSQL per receipt: {cost['postgres_cpu_us']} us CPU, "
                f"{cost['wal_bytes']} WAL bytes, {cost['statements']} statements"
            )
            runs.append(run)
    alternating.write(RESULTS, {"runs": runs})


if __name__ == "__main__":
    main()
