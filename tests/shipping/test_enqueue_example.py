"""examples/07-enqueue-in-transaction: the receipt of the committed order is sent by a worker,
the rolled-back order leaves no receipt."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg

from notify_queue.providers.simulated import SimulatedProvider
from tests.support import eventually, start_workers

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "07-enqueue-in-transaction"


async def test_the_enqueue_example_sends_the_committed_receipt_only(database_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": database_url}
    result = subprocess.run(
        [sys.executable, str(EXAMPLE / "receipt.py")],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    committed = re.search(r"committed (\S+): receipt (\S+) PENDING", result.stdout)
    failed = re.search(r"rolled back (\S+) \(payment declined\): no receipt", result.stdout)
    assert committed and failed, result.stdout + result.stderr
    with psycopg.connect(database_url) as conn:
        keys = [r[0] for r in conn.execute("SELECT idempotency_key FROM nq_all_notifications")]
    assert keys == [f"{committed[1]}-receipt"]

    provider = SimulatedProvider(failure_rate=0.0, latency_ms=0, timeout_seconds=10)
    workers = await start_workers(database_url, provider)
    try:

        async def sent() -> bool:
            async with await psycopg.AsyncConnection.connect(database_url) as conn:
                cur = await conn.execute(
                    "SELECT status FROM nq_all_notifications WHERE id = %s", [committed[2]]
                )
                return await cur.fetchone() == ("SENT",)

        await eventually(sent, timeout=60, what="the committed order's receipt SENT")
    finally:
        await workers.stop()
    assert provider.deliveries == 1
