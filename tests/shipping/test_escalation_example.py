"""examples/08-escalation: the push goes out, the acknowledgement cancels the SMS and the call;
through a real `notify-queue api` process and a worker loop with the simulated provider, serving
the channels a worker serves by default."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from notify_queue.providers.simulated import SimulatedProvider
from tests.support import running_api, start_workers

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "08-escalation"


async def test_the_escalation_example_pages_then_acknowledges(
    database_url: str, tmp_path: Path
) -> None:
    provider = SimulatedProvider(failure_rate=0.0, latency_ms=0, timeout_seconds=10)
    workers = await start_workers(database_url, provider)  # the default channels: voice too
    try:
        async with running_api(database_url, tmp_path / "api.log") as url:
            env = {**os.environ, "NOTIFY_QUEUE_URL": url}
            # In a thread: the workers run on this event loop meanwhile.
            result = await asyncio.to_thread(
                subprocess.run, [sys.executable, str(EXAMPLE / "page_oncall.py")],
                env=env, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
    finally:
        await workers.stop()
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].endswith(" active") and lines[1] == "push SENT"
    assert lines[2].endswith(" acknowledged by ana")
    assert lines[3:] == [
        "  push  SENT",
        "  sms   CANCELLED acknowledged",
        "  voice CANCELLED acknowledged",
    ]
    assert provider.deliveries == 1
