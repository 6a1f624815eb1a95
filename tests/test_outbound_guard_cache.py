"""The outbound guard is consulted once per host and TTL, and connections stay alive per host.

A name is resolved and vetted when a connection to it is dialled; the verdict (the vetted
addresses, or the refusal) is kept for the TTL, so a stream of events to one receiver neither
asks DNS nor re-checks addresses per request. The kept answer is also what is dialled, so a name
that re-resolves elsewhere inside the TTL (DNS rebinding) is still dialled at its vetted address.

The client is the relay's (`providers/posting.py`, `guarded_poster`). Real aiohttp servers listen
on loopback; names come from a fixed table that counts how often it
is asked (the guard vets exactly what the table answers), and a stepped clock stands for time.
Servers that answer `Connection: close` force a new dial per request, which is what shows the
TTL (a kept-alive connection would not dial at all).
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import test_utils, web
from aiohttp.abc import AbstractResolver, ResolveResult

from notify_queue.providers.outbound import OutboundRefused
from notify_queue.providers.posting import Poster, guarded_poster


class CountingResolver(AbstractResolver):
    """DNS answers from a table that can change, counting the questions per name."""

    def __init__(self, table: dict[str, str]) -> None:
        self.table = table
        self.asked: dict[str, int] = {}

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.asked[host] = self.asked.get(host, 0) + 1
        return [
            ResolveResult(
                hostname=host,
                host=self.table[host],
                port=port,
                family=socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
        ]

    async def close(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Server:
    """Counts requests and the distinct client connections they came on."""

    def __init__(self, host: str, *, close: bool, port: int | None = None) -> None:
        self.hits = 0
        self.connections: set[tuple[str, int]] = set()
        self.close = close
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.server = test_utils.TestServer(app, host=host, port=port)

    async def _handle(self, request: web.Request) -> web.Response:
        self.hits += 1
        assert request.transport is not None
        self.connections.add(request.transport.get_extra_info("peername")[:2])
        return web.Response(status=204, headers={"Connection": "close"} if self.close else {})

    @property
    def port(self) -> int:
        port = self.server.port
        assert port is not None
        return port


ServerFactory = Callable[..., Awaitable[Server]]


@pytest.fixture
async def start_server() -> AsyncIterator[ServerFactory]:
    started: list[Server] = []

    async def start(
        host: str = "127.0.0.1", *, close: bool = False, port: int | None = None
    ) -> Server:
        server = Server(host, close=close, port=port)
        await server.server.start_server()
        started.append(server)
        return server

    yield start
    for server in started:
        await server.server.close()


async def post(poster: Poster, url: str) -> None:
    assert (await poster.post(url, b"{}", {})).status == 204


async def test_a_stream_of_posts_to_one_host_uses_one_kept_alive_connection_and_one_lookup(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    resolver = CountingResolver({"hooks.example": "127.0.0.1"})
    async with guarded_poster(
        allow=["127.0.0.1/32"], timeout_seconds=5, resolver=resolver
    ) as poster:
        for _ in range(20):
            await post(poster, f"http://hooks.example:{server.port}/hook")
    assert server.hits == 20
    assert len(server.connections) == 1
    assert resolver.asked == {"hooks.example": 1}


async def test_the_guard_is_consulted_once_per_host_within_the_ttl_and_again_after_it(
    start_server: ServerFactory,
) -> None:
    server = await start_server(close=True)
    resolver = CountingResolver({"a.example": "127.0.0.1", "b.example": "127.0.0.1"})
    clock = Clock()
    async with guarded_poster(
        allow=["127.0.0.1/32"],
        timeout_seconds=5,
        resolver=resolver,
        guard_ttl_seconds=60,
        clock=clock,
    ) as poster:
        for _ in range(5):
            await post(poster, f"http://a.example:{server.port}/")
        await post(poster, f"http://b.example:{server.port}/")
        assert resolver.asked == {"a.example": 1, "b.example": 1}
        clock.now += 59
        await post(poster, f"http://a.example:{server.port}/")
        assert resolver.asked["a.example"] == 1
        clock.now += 2  # past the TTL
        await post(poster, f"http://a.example:{server.port}/")
        await post(poster, f"http://a.example:{server.port}/")
        assert resolver.asked["a.example"] == 2
    # Every request dialled anew (the server closed each connection), so every one of them went
    # through the resolver: the kept verdict is what saved the lookups.
    assert server.hits == 9
    assert len(server.connections) == 9


async def test_with_a_ttl_of_zero_the_guard_is_consulted_on_every_dial(
    start_server: ServerFactory,
) -> None:
    # Negative control for the test above: the same requests, nothing kept.
    server = await start_server(close=True)
    resolver = CountingResolver({"a.example": "127.0.0.1"})
    async with guarded_poster(
        allow=["127.0.0.1/32"], timeout_seconds=5, resolver=resolver, guard_ttl_seconds=0
    ) as poster:
        for _ in range(5):
            await post(poster, f"http://a.example:{server.port}/")
    assert resolver.asked == {"a.example": 5}
    assert server.hits == 5


async def test_a_refusal_is_kept_for_the_ttl_and_asked_again_after_it() -> None:
    resolver = CountingResolver({"intranet.example": "10.0.0.7"})
    clock = Clock()
    async with guarded_poster(
        allow=[], timeout_seconds=5, resolver=resolver, guard_ttl_seconds=60, clock=clock
    ) as poster:
        for _ in range(3):
            with pytest.raises(OutboundRefused, match=r"'intranet\.example'.*private"):
                await poster.post("http://intranet.example/hook", b"{}", {})
        assert resolver.asked == {"intranet.example": 1}
        clock.now += 61
        with pytest.raises(OutboundRefused, match="private"):
            await poster.post("http://intranet.example/hook", b"{}", {})
        assert resolver.asked == {"intranet.example": 2}


async def test_a_name_rebound_inside_the_ttl_is_still_dialled_at_its_vetted_address(
    start_server: ServerFactory,
) -> None:
    vetted = await start_server("127.0.0.1", close=True)
    # The same port on another address: only the address dialled tells them apart.
    inside = await start_server("127.0.0.2", close=True, port=vetted.port)
    url = f"http://hooks.example:{vetted.port}/"
    resolver = CountingResolver({"hooks.example": "127.0.0.1"})
    clock = Clock()
    async with guarded_poster(
        allow=["127.0.0.1/32"],
        timeout_seconds=5,
        resolver=resolver,
        guard_ttl_seconds=60,
        clock=clock,
    ) as poster:
        await post(poster, url)
        resolver.table["hooks.example"] = "127.0.0.2"  # the name now points inside
        await post(poster, url)  # a new dial (the server closed), to the vetted address
        await post(poster, url)
        clock.now += 61
        with pytest.raises(OutboundRefused, match=r"127\.0\.0\.2 is a loopback"):
            await poster.post(url, b"{}", {})
    assert resolver.asked == {"hooks.example": 2}
    assert vetted.hits == 3
    assert inside.hits == 0


async def test_a_literal_address_is_judged_the_same_on_every_request() -> None:
    async with guarded_poster(allow=["127.0.0.1/32"], timeout_seconds=5) as poster:
        for _ in range(3):
            with pytest.raises(OutboundRefused, match="private"):
                await poster.post("http://10.0.0.1/", b"{}", {})
