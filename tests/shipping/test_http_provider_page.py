"""The gateway of docs/http-provider.md, run as written, answers the real HTTP provider the way
the page says: sent with its message id, the same id for a repeated Idempotency-Key, and a
permanent failure carrying the status and the start of its body."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from notify_queue.models import Channel, Outcome
from notify_queue.providers.base import DeliveryRequest
from notify_queue.providers.http import HttpProvider
from notify_queue.providers.outbound import trusted_session
from tests.shipping.support import ROOT
from tests.support import free_port

_BLOCK = re.compile(r"<!-- http-provider: gateway -->\s*\n```python\n(.*?)\n```", re.S)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[str]:
    (code,) = _BLOCK.findall((ROOT / "docs" / "http-provider.md").read_text())
    source = tmp_path / "gateway.py"
    source.write_text(code + "\n")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(source)],
        env=os.environ | {"PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, "the gateway exited"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the gateway never listened"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/send"
    finally:
        process.kill()
        process.wait()


def _request(recipient: str, id: uuid.UUID | None = None) -> DeliveryRequest:
    return DeliveryRequest(id or uuid.uuid4(), Channel.SMS, recipient, None, "Your code is 1")


async def test_the_pages_gateway_is_answered_as_the_page_says(gateway: str) -> None:
    async with trusted_session(timeout_seconds=10.0) as session:
        provider = HttpProvider(gateway, 5.0, session)
        first = _request("+4915112345678")
        sent = await provider.deliver(first)
        again = await provider.deliver(_request("+4915112345678", first.id))
        other = await provider.deliver(_request("+4915112345678"))
        refused = await provider.deliver(_request("someone@example.com"))
    assert sent.outcome is Outcome.SENT and sent.provider_message_id
    assert again.provider_message_id == sent.provider_message_id
    assert other.provider_message_id not in (None, sent.provider_message_id)
    assert refused.outcome is Outcome.PERMANENT_FAILURE
    assert refused.error == 'HTTP 422: {"error": "not a phone number"}'
