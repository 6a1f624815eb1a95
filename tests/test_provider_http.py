"""The HTTP provider's wire format and outcome classification (CONTRACT section 5).

A real aiohttp server on 127.0.0.1 plays the delivery service: it answers each status class,
sends Retry-After in both forms, hangs, streams without end and records what it received. The
provider talks to it through the guarded outbound session with loopback allowed.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import aiohttp
import pytest
from aiohttp import test_utils, web

from notify_queue.models import Channel, Outcome
from notify_queue.providers import SimulatedProvider, build_providers
from notify_queue.providers.base import DeliveryRequest
from notify_queue.providers.http import HttpProvider, parse_retry_after
from notify_queue.providers.outbound import trusted_session
from notify_queue.providers.specs import specs_from_settings
from notify_queue.settings import ProviderKind, WorkerSettings
from tests.test_posting import RawServer


class DeliveryService:
    """The receiving end: records every request; routes choose the answer."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], Any]] = []
        self.release_hanging = asyncio.Event()
        self.flaky_calls = 0
        app = web.Application()
        app.router.add_post("/ok", self.ok)
        app.router.add_post("/status/{code}", self.status)
        app.router.add_post("/json", self.json_answer)
        app.router.add_post("/retry-seconds", self.retry_seconds)
        app.router.add_post("/retry-date", self.retry_date)
        app.router.add_post("/hang", self.hang)
        app.router.add_post("/endless", self.endless)
        app.router.add_post("/flaky", self.flaky)
        app.router.add_post("/redirect", self.redirect)
        self.server = test_utils.TestServer(app, host="127.0.0.1")

    def url(self, path: str) -> str:
        return str(self.server.make_url(path))

    async def _record(self, request: web.Request) -> None:
        self.received.append((dict(request.headers), await request.json()))

    async def ok(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.Response(text="accepted")

    async def status(self, request: web.Request) -> web.Response:
        await self._record(request)
        code = int(request.match_info["code"])
        return web.Response(status=code, text=f"answer {code}: " + "x" * 500)

    async def json_answer(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.Response(text=request.query["body"], content_type="application/json")

    async def retry_seconds(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.Response(status=429, text="slow down", headers={"Retry-After": "7"})

    async def retry_date(self, request: web.Request) -> web.Response:
        await self._record(request)
        when = datetime.now(UTC) + timedelta(seconds=120)
        headers = {"Retry-After": format_datetime(when, usegmt=True)}
        return web.Response(status=503, text="maintenance", headers=headers)

    async def hang(self, request: web.Request) -> web.Response:
        await self.release_hanging.wait()
        return web.Response(text="too late")

    async def endless(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=200)
        await response.prepare(request)
        chunk = b"x" * 65536
        try:
            while not self.release_hanging.is_set():
                await response.write(chunk)
        except ConnectionError:
            pass  # the client stopped reading and hung up, as it should
        return response

    async def flaky(self, request: web.Request) -> web.Response:
        await self._record(request)
        self.flaky_calls += 1
        if self.flaky_calls == 1:
            return web.Response(status=503, text="try again")
        return web.json_response({"messageId": "flaky-1"})

    async def redirect(self, request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(self.url("/ok"))


@pytest.fixture
async def service() -> AsyncIterator[DeliveryService]:
    service = DeliveryService()
    await service.server.start_server()
    yield service
    service.release_hanging.set()
    await service.server.close()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with trusted_session(timeout_seconds=10.0) as session:
        yield session


def make_request(**overrides: Any) -> DeliveryRequest:
    fields: dict[str, Any] = {
        "id": uuid.uuid4(),
        "channel": Channel.SMS,
        "recipient": "+4915112345678",
        "subject": None,
        "body": "Your code is 123456",
        "metadata": {"order": 1001},
    }
    fields.update(overrides)
    return DeliveryRequest(**fields)


async def test_the_request_carries_the_contract_body_and_the_idempotency_key(
    service: DeliveryService, session: aiohttp.ClientSession
) -> None:
    request = make_request(subject="Hello", body="Grüße")
    result = await HttpProvider(service.url("/ok"), 5.0, session).deliver(request)

    assert result.outcome is Outcome.SENT
    headers, body = service.received[0]
    assert headers["Idempotency-Key"] == str(request.id)
    assert headers["Content-Type"] == "application/json"
    assert body == {
        "id": str(request.id),
        "channel": "sms",
        "recipient": "+4915112345678",
        "subject": "Hello",
        "body": "Grüße",
        "metadata": {"order": 1001},
    }


async def test_the_idempotency_key_is_the_same_on_every_attempt(
    service: DeliveryService, session: aiohttp.ClientSession
) -> None:
    provider = HttpProvider(service.url("/flaky"), 5.0, session)
    request = make_request()

    first = await provider.deliver(request)
    second = await provider.deliver(request)

    assert (first.outcome, second.outcome) == (Outcome.TEMPORARY_FAILURE, Outcome.SENT)
    keys = [headers["Idempotency-Key"] for headers, _ in service.received]
    assert keys == [str(request.id), str(request.id)]


@pytest.mark.parametrize(
    ("answer", "message_id"),
    [
        ('{"messageId": "msg-42", "id": "ignored"}', "msg-42"),
        ('{"id": 987}', "987"),
        ('{"status": "queued"}', None),
        ("[1, 2]", None),
        ("not json at all", None),
        ("", None),
    ],
)
async def test_a_2xx_is_sent_with_the_message_id_from_a_json_answer(
    service: DeliveryService, session: aiohttp.ClientSession, answer: str, message_id: str | None
) -> None:
    url = str(service.server.make_url("/json").with_query(body=answer))
    result = await HttpProvider(url, 5.0, session).deliver(make_request())
    assert result.outcome is Outcome.SENT
    assert result.provider_message_id == message_id


@pytest.mark.parametrize("code", [408, 425, 429, 500, 502, 503, 504])
async def test_retryable_statuses_are_temporary_failures(
    service: DeliveryService, session: aiohttp.ClientSession, code: int
) -> None:
    result = await HttpProvider(service.url(f"/status/{code}"), 5.0, session).deliver(
        make_request()
    )
    assert result.outcome is Outcome.TEMPORARY_FAILURE
    assert result.error is not None
    assert result.error.startswith(f"HTTP {code}: answer {code}: xxx")


async def test_a_410_says_the_address_is_no_longer_valid_and_is_permanent(
    service: DeliveryService, session: aiohttp.ClientSession
) -> None:
    result = await HttpProvider(service.url("/status/410"), 5.0, session).deliver(make_request())
    assert result.outcome is Outcome.PERMANENT_FAILURE
    assert result.error is not None and result.error.startswith("address no longer valid: HTTP 410")


@pytest.mark.parametrize("code", [429, 503])
async def test_429_and_503_prove_nothing_was_sent(
    service: DeliveryService, session: aiohttp.ClientSession, code: int
) -> None:
    result = await HttpProvider(service.url(f"/status/{code}"), 5.0, session).deliver(
        make_request()
    )
    assert result.outcome is Outcome.TEMPORARY_FAILURE and result.nothing_sent


@pytest.mark.parametrize("code", [500, 502, 504, 408])
async def test_other_temporary_statuses_may_have_been_acted_on(
    service: DeliveryService, session: aiohttp.ClientSession, code: int
) -> None:
    result = await HttpProvider(service.url(f"/status/{code}"), 5.0, session).deliver(
        make_request()
    )
    assert result.outcome is Outcome.TEMPORARY_FAILURE and not result.nothing_sent


async def test_a_refused_connection_proves_nothing_was_sent(
    session: aiohttp.ClientSession,
) -> None:
    result = await HttpProvider("http://127.0.0.1:9/send", 5.0, session).deliver(make_request())
    assert result.outcome is Outcome.TEMPORARY_FAILURE and result.nothing_sent


@pytest.mark.parametrize("code", [400, 401, 403, 404, 409, 422, 301])
async def test_other_statuses_are_permanent_failures_with_the_start_of_the_body(
    service: DeliveryService, session: aiohttp.ClientSession, code: int
) -> None:
    result = await HttpProvider(service.url(f"/status/{code}"), 5.0, session).deliver(
        make_request()
    )
    assert result.outcome is Outcome.PERMANENT_FAILURE
    assert result.error is not None
    assert result.error.startswith(f"HTTP {code}: answer {code}:")
    assert len(result.error) <= len(f"HTTP {code}: ") + 200


async def test_a_redirect_is_not_followed(
    service: DeliveryService, session: aiohttp.ClientSession
) -> None:
    result = await HttpProvider(service.url("/redirect"), 5.0, session).deliver(make_request())
    assert result.outcome is Outcome.PERMANENT_FAILURE
    assert result.error is not None and result.error.startswith("HTTP 307")
    assert service.received == []


async def test_retry_after_in_seconds_sets_the_wait(
    service: DeliveryService, session: aiohttp.ClientSession
) -> None:
    result = await HttpProvider(service.url("/retry-seconds"), 5.0, session).deliver(make_request())
    assert result.outcome is Outcome.TEMPORARY_FAILURE
    assert result.retry_after_seconds == 7.0


async def test_retry_after_as_an_http_date_sets_the_wait(
    service: DeliveryService, session: aiohttp.ClientSession
) -> None:
    result = await HttpProvider(service.url("/retry-date"), 5.0, session).deliver(make_request())
    assert result.outcome is Outcome.TEMPORARY_FAILURE
    assert result.retry_after_seconds is not None
    assert 110 <= result.retry_after_seconds <= 120


def test_retry_after_values_that_are_not_a_delay_are_ignored() -> None:
    now = datetime(2026, 9, 24, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("-5") is None
    assert parse_retry_after("Thu, 24 Sep 2026 11:00:00 GMT", now=now) == 0.0
    assert parse_retry_after("Thu, 24 Sep 2026 12:01:30 GMT", now=now) == 90.0


async def test_a_provider_that_does_not_answer_in_time_is_a_temporary_failure(
    service: DeliveryService, session: aiohttp.ClientSession
) -> None:
    result = await HttpProvider(service.url("/hang"), 0.2, session).deliver(make_request())
    assert result.outcome is Outcome.TEMPORARY_FAILURE
    assert result.error == "timed out after 0.2s"


async def test_a_refused_connection_is_a_temporary_failure(
    session: aiohttp.ClientSession,
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = probe.getsockname()[1]
    provider = HttpProvider(f"http://127.0.0.1:{free_port}/send", 5.0, session)
    result = await provider.deliver(make_request())
    assert result.outcome is Outcome.TEMPORARY_FAILURE
    assert result.error is not None and result.error.startswith("connection error:")


async def test_an_endless_answer_is_read_only_up_to_the_cap(
    service: DeliveryService, session: aiohttp.ClientSession
) -> None:
    # Reading the whole body would run into the timeout; the cap makes it a prompt SENT.
    result = await HttpProvider(service.url("/endless"), 5.0, session).deliver(make_request())
    assert result.outcome is Outcome.SENT
    assert result.provider_message_id is None


async def test_the_configured_provider_url_is_reached_on_a_private_address_without_allow_list(
    service: DeliveryService,
) -> None:
    # The provider URL is the operator's own endpoint (a gateway Service in the cluster), so the
    # worker's session for it is not guarded; `--outbound-allow` is only for client URLs.
    async with trusted_session(timeout_seconds=5.0) as session:
        settings = WorkerSettings(provider=ProviderKind.HTTP, provider_url=service.url("/ok"))
        providers = build_providers(specs_from_settings(settings), session)
        result = await providers["http"].deliver(make_request())
    assert result.outcome is Outcome.SENT


async def test_the_flags_define_one_named_provider_per_kind_serving_its_channels(
    session: aiohttp.ClientSession,
) -> None:
    settings = WorkerSettings(
        provider=ProviderKind.HTTP,
        push_provider=ProviderKind.SIMULATED,
        provider_url="http://127.0.0.1:9/send",
    )
    specs = specs_from_settings(settings)
    providers = build_providers(specs, session)

    assert specs.chain(Channel.EMAIL) == ["http"] and specs.chain(Channel.SMS) == ["http"]
    assert specs.chain(Channel.PUSH) == ["simulated"]
    assert isinstance(providers["http"], HttpProvider)
    assert isinstance(providers["simulated"], SimulatedProvider)
    assert all(p.circuit_breaker is None and p.rate_limit is None for p in specs.providers)


async def test_a_kept_connection_closed_after_the_request_is_an_unknown_outcome_sent_once(
    session: aiohttp.ClientSession,
) -> None:
    """The service reads the whole request on a kept connection and closes without answering:
    the request reached it, so the outcome is unknown (temporary, not `nothing_sent`: failover
    keeps the notification on this provider) and aiohttp does not send the POST again."""
    server = RawServer(
        lambda n, request: b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n" if n == 0 else None
    )
    await server.start()
    try:
        provider = HttpProvider(server.url(), 5.0, session)
        assert (await provider.deliver(make_request())).outcome is Outcome.SENT
        result = await provider.deliver(make_request())
    finally:
        assert server.server is not None
        server.server.close()
    assert result.outcome is Outcome.TEMPORARY_FAILURE and not result.nothing_sent
    assert [c for c, _ in server.requests] == [0, 0]
