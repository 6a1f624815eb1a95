"""The outbound guard: client-supplied webhook URLs cannot reach loopback, private or metadata
addresses, through the relay's client (`providers/posting.py`, `guarded_poster`).

Real aiohttp servers listen on loopback so a refused call is shown not to arrive; names are
resolved either by the system resolver (`localhost`) or by a fixed table standing in for DNS,
which is how a public-looking name pointing inside the network is simulated.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import test_utils, web
from aiohttp.abc import AbstractResolver, ResolveResult

from notify_queue.providers.outbound import (
    GuardedResolver,
    OutboundAllowList,
    OutboundRefused,
    forbidden_reason,
)
from notify_queue.providers.posting import Answer, Poster, guarded_poster


class FixedResolver(AbstractResolver):
    """DNS answers from a table: lets a test point any name at any address."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for address in self.table[host]
        ]

    async def close(self) -> None:
        pass


class Receiver:
    """A loopback HTTP server that counts the requests it gets and can redirect."""

    def __init__(self, host: str, redirect_to: str | None = None) -> None:
        self.hits = 0
        self.redirect_to = redirect_to
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.server = test_utils.TestServer(app, host=host)

    async def _handle(self, request: web.Request) -> web.Response:
        self.hits += 1
        if self.redirect_to is not None:
            raise web.HTTPFound(self.redirect_to)
        return web.Response(text="reached")

    def url(self, path: str = "/") -> str:
        return str(self.server.make_url(path))


ReceiverFactory = Callable[..., Awaitable[Receiver]]


@pytest.fixture
async def start_receiver() -> AsyncIterator[ReceiverFactory]:
    started: list[Receiver] = []

    async def start(host: str = "127.0.0.1", redirect_to: str | None = None) -> Receiver:
        receiver = Receiver(host, redirect_to)
        await receiver.server.start_server()
        started.append(receiver)
        return receiver

    yield start
    for receiver in started:
        await receiver.server.close()


def poster_for(allow: list[str], table: dict[str, list[str]] | None = None) -> Poster:
    resolver = FixedResolver(table) if table is not None else None
    return guarded_poster(allow=allow, timeout_seconds=5.0, resolver=resolver)


async def post(poster: Poster, url: str) -> Answer:
    return await poster.post(url, b"{}", {})


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("fd12:3456::1", "private"),
        ("169.254.169.254", "cloud metadata"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("0.0.0.0", "unspecified"),  # noqa: S104 - an address under test, not a bind
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("240.0.0.1", "reserved"),
        ("192.0.2.10", "not a globally routable"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:169.254.169.254", "cloud metadata"),
    ],
)
def test_each_kind_of_internal_address_is_refused_with_its_reason(
    address: str, reason: str
) -> None:
    assert reason in (forbidden_reason(ipaddress.ip_address(address)) or "")


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111"])
def test_public_addresses_pass(address: str) -> None:
    assert forbidden_reason(ipaddress.ip_address(address)) is None


async def test_a_name_that_resolves_to_loopback_is_refused(start_receiver: ReceiverFactory) -> None:
    receiver = await start_receiver()
    async with poster_for(allow=[]) as poster:
        with pytest.raises(OutboundRefused, match=r"'localhost'.*loopback"):
            await post(poster, f"http://localhost:{receiver.server.port}/")
    assert receiver.hits == 0


@pytest.mark.parametrize(
    ("name", "address", "reason"),
    [
        ("intranet.example", "10.0.0.7", "private"),
        ("metadata.example", "169.254.169.254", "cloud metadata"),
        ("router.example", "fe80::1", "link-local"),
        ("carrier.example", "100.64.3.4", "carrier-grade NAT"),
    ],
)
async def test_a_public_looking_name_pointing_inside_is_refused(
    name: str, address: str, reason: str
) -> None:
    async with poster_for(allow=[], table={name: [address]}) as poster:
        with pytest.raises(OutboundRefused, match=f"'{name}'.*{reason}"):
            await post(poster, f"http://{name}/hook")


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
        "http://192.168.0.1:8080/admin",
        "http://[fe80::1]/",
        "http://[::ffff:127.0.0.1]/",
    ],
)
async def test_literal_internal_ip_urls_are_refused_without_a_connection(url: str) -> None:
    async with poster_for(allow=[]) as poster:
        with pytest.raises(OutboundRefused):
            await post(poster, url)


async def test_a_literal_loopback_ip_is_refused_before_the_server_sees_anything(
    start_receiver: ReceiverFactory,
) -> None:
    receiver = await start_receiver()
    async with poster_for(allow=[]) as poster:
        with pytest.raises(OutboundRefused, match=r"'127\.0\.0\.1'.*loopback"):
            await post(poster, receiver.url())
    assert receiver.hits == 0


async def test_an_allowed_cidr_opens_the_guard(start_receiver: ReceiverFactory) -> None:
    receiver = await start_receiver()
    async with poster_for(allow=["127.0.0.0/8"]) as poster:
        assert await post(poster, receiver.url()) == Answer(200, b"reached")
    assert receiver.hits == 1


async def test_an_allowed_host_name_opens_the_guard_for_that_name_only(
    start_receiver: ReceiverFactory,
) -> None:
    receiver = await start_receiver()
    port = receiver.server.port
    table = {"receiver.internal": ["127.0.0.1"], "other.internal": ["127.0.0.1"]}
    async with poster_for(allow=["Receiver.Internal."], table=table) as poster:
        assert (await post(poster, f"http://receiver.internal:{port}/")).status == 200
        with pytest.raises(OutboundRefused, match=r"other\.internal"):
            await post(poster, f"http://other.internal:{port}/")
    assert receiver.hits == 1


async def test_a_name_resolving_to_both_public_and_private_addresses_is_refused() -> None:
    resolver = GuardedResolver(
        OutboundAllowList.parse([]),
        FixedResolver({"mixed.example": ["93.184.216.34", "10.0.0.1"]}),
    )
    with pytest.raises(OutboundRefused, match="private"):
        await resolver.resolve("mixed.example", 443)


async def test_a_name_resolving_to_public_addresses_passes_the_resolver() -> None:
    resolver = GuardedResolver(
        OutboundAllowList.parse([]),
        FixedResolver({"public.example": ["93.184.216.34", "2606:2800:220:1::1"]}),
    )
    results = await resolver.resolve("public.example", 443)
    assert [r["host"] for r in results] == ["93.184.216.34", "2606:2800:220:1::1"]


async def test_a_redirect_from_an_allowed_server_to_a_loopback_address_is_not_followed(
    start_receiver: ReceiverFactory,
) -> None:
    forbidden = await start_receiver(host="127.0.0.2")
    allowed = await start_receiver(host="127.0.0.1", redirect_to=forbidden.url("/secret"))
    async with poster_for(allow=["127.0.0.1/32"]) as poster:
        assert (await post(poster, allowed.url())).status == 302
    assert allowed.hits == 1
    assert forbidden.hits == 0


@pytest.mark.parametrize(
    "location", ["http://169.254.169.254/latest/meta-data/", "http://intranet.example/"]
)
async def test_a_redirect_inside_is_an_answer_never_a_second_request(
    start_receiver: ReceiverFactory, location: str
) -> None:
    allowed = await start_receiver(redirect_to=location)
    table = {"intranet.example": ["10.9.8.7"]}
    async with poster_for(allow=["127.0.0.1/32"], table=table) as poster:
        assert (await post(poster, allowed.url())).status == 302
    assert allowed.hits == 1


def test_the_allow_list_accepts_cidrs_single_addresses_and_names() -> None:
    allow = OutboundAllowList.parse(["10.0.0.0/8", "192.168.1.5", " hooks.internal ", ""])
    assert allow.allows_address(ipaddress.ip_address("10.200.0.1"))
    assert allow.allows_address(ipaddress.ip_address("192.168.1.5"))
    assert not allow.allows_address(ipaddress.ip_address("192.168.1.6"))
    assert allow.allows_host("HOOKS.internal.")
    assert not allow.allows_host("evil.internal")
