"""Webhook POSTs and their Standard Webhooks signatures (CONTRACT section 6).

A real receiver on loopback records the raw body and headers, and the signature is checked
with `standardwebhooks.Webhook.verify`, a verifier we did not write, for one secret and for
each secret of a rotation pair.
"""

from __future__ import annotations

import base64
import json
import os
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from aiohttp import test_utils, web
from standardwebhooks import Webhook, WebhookVerificationError

from notify_queue.providers.posting import guarded_poster
from notify_queue.providers.webhooks import WebhookSender


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()


class Receiver:
    """Records each POST as (raw body, headers) and answers with `status`."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, str]]] = []
        self.status = 204
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self.server = test_utils.TestServer(app, host="127.0.0.1")

    async def handle(self, request: web.Request) -> web.Response:
        self.received.append((await request.text(), dict(request.headers)))
        return web.Response(status=self.status, text="" if self.status < 300 else "no thanks")

    @property
    def url(self) -> str:
        return str(self.server.make_url("/hook"))


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    receiver = Receiver()
    await receiver.server.start_server()
    yield receiver
    await receiver.server.close()


@pytest.fixture
async def sender() -> AsyncIterator[WebhookSender]:
    poster = guarded_poster(allow=["127.0.0.1/32"], timeout_seconds=5.0)
    yield WebhookSender(poster, timeout_seconds=5.0)
    await poster.close()


def event_payload(event_id: str) -> str:
    return json.dumps(
        {
            "eventId": event_id,
            "jobId": str(uuid.uuid4()),
            "status": "SENT",
            "attemptCount": 2,
            "timestamp": "2026-09-24T12:01:03Z",
        }
    )


async def test_an_event_signed_with_one_secret_verifies_with_the_reference_library(
    receiver: Receiver, sender: WebhookSender
) -> None:
    secret = new_secret()
    event_id = str(uuid.uuid4())
    payload = event_payload(event_id)

    error = await sender.post(
        event_id=event_id, url=receiver.url, payload=payload, secrets=(secret,)
    )

    assert error is None
    [(body, headers)] = receiver.received
    assert body == payload
    assert headers["Content-Type"] == "application/json"
    assert headers["webhook-id"] == event_id
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 60
    assert Webhook(secret).verify(body, headers) == json.loads(payload)


async def test_during_a_rotation_each_of_the_two_secrets_verifies_the_event(
    receiver: Receiver, sender: WebhookSender
) -> None:
    old_secret, new_secret_ = new_secret(), new_secret()
    event_id = str(uuid.uuid4())
    payload = event_payload(event_id)

    await sender.post(
        event_id=event_id, url=receiver.url, payload=payload, secrets=(old_secret, new_secret_)
    )

    [(body, headers)] = receiver.received
    signatures = headers["webhook-signature"].split(" ")
    assert len(signatures) == 2
    assert all(s.startswith("v1,") for s in signatures)
    Webhook(old_secret).verify(body, headers)
    Webhook(new_secret_).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(body, headers)


async def test_a_tampered_body_does_not_verify(receiver: Receiver, sender: WebhookSender) -> None:
    secret = new_secret()
    event_id = str(uuid.uuid4())
    await sender.post(
        event_id=event_id, url=receiver.url, payload=event_payload(event_id), secrets=(secret,)
    )
    [(body, headers)] = receiver.received
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body.replace("SENT", "FAILED"), headers)


async def test_without_secrets_the_event_is_sent_unsigned(
    receiver: Receiver, sender: WebhookSender
) -> None:
    event_id = str(uuid.uuid4())
    error = await sender.post(
        event_id=event_id, url=receiver.url, payload=event_payload(event_id), secrets=()
    )
    assert error is None
    [(_, headers)] = receiver.received
    assert headers["webhook-id"] == event_id
    assert "webhook-timestamp" in headers
    assert "webhook-signature" not in headers


async def test_every_attempt_of_an_event_carries_the_same_webhook_id(
    receiver: Receiver, sender: WebhookSender
) -> None:
    receiver.status = 503
    event_id = str(uuid.uuid4())
    payload = event_payload(event_id)

    first = await sender.post(event_id=event_id, url=receiver.url, payload=payload, secrets=())
    receiver.status = 200
    second = await sender.post(event_id=event_id, url=receiver.url, payload=payload, secrets=())

    assert first == "HTTP 503: no thanks"
    assert second is None
    assert [headers["webhook-id"] for _, headers in receiver.received] == [event_id, event_id]


async def test_a_receiver_in_a_private_network_is_refused_with_the_reason() -> None:
    poster = guarded_poster(allow=[], timeout_seconds=5.0)
    sender = WebhookSender(poster, timeout_seconds=5.0)
    error = await sender.post(
        event_id="e-1", url="http://10.1.2.3/hook", payload="{}", secrets=(new_secret(),)
    )
    await poster.close()
    assert error is not None
    assert "'10.1.2.3'" in error and "private" in error


@pytest.mark.parametrize("bad_secret", ["whsec_", "whsec_a"])
async def test_a_malformed_secret_is_reported_and_nothing_is_sent(
    receiver: Receiver, sender: WebhookSender, bad_secret: str
) -> None:
    error = await sender.post(
        event_id="e-2", url=receiver.url, payload="{}", secrets=(new_secret(), bad_secret)
    )
    assert error is not None and error.startswith("invalid webhook secret")
    assert receiver.received == []


async def test_an_unreachable_receiver_is_reported_as_a_connection_error(
    sender: WebhookSender,
) -> None:
    receiver = Receiver()
    await receiver.server.start_server()
    url = receiver.url
    await receiver.server.close()

    error = await sender.post(event_id="e-3", url=url, payload="{}", secrets=())

    assert error is not None and error.startswith("connection error")
