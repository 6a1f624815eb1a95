"""Outbound HTTP safety: URLs that clients supply must not reach the inside of our network.

Trust follows who chose the URL. Endpoints set by whoever installs and runs the system (provider
URLs, the SMTP host, `--webhook-url`) are reached wherever they are: in a cluster the SMS gateway
or the mail relay is usually a Service on a private address (`trusted_session`). URLs that API
clients or namespace users supply (a notification's `webhookUrl`, a NotificationPolicy's webhook)
go through the guard (`outbound_session`): without it anyone who can create a notification
could make a worker POST to the cloud metadata service, to PostgreSQL's neighbours or to
loopback admin ports (server-side request forgery). The check has to happen on the address
actually dialled, not on the URL text, because a public-looking name can resolve to
10.0.0.5 (or re-resolve to it later: DNS rebinding). So the guard sits in two places of the
aiohttp session that every outbound call uses:

* a resolver wrapping aiohttp's default one, which refuses the name when any address it
  resolves to is not public; the connector only ever dials what the resolver returned, and
  a refused answer is never cached;
* a client middleware that checks literal IP hosts (aiohttp dials those without asking the
  resolver). Middlewares run once per hop, so a redirect to `http://169.254.169.254/` is
  refused just like a first request to it, and a redirect to a name goes through the resolver.

`allow` opens holes on purpose (a receiver on loopback in development, a provider on a private
network): an entry is a CIDR, matched against the resolved address, or a host name, matched
against the name in the URL.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from notify_queue.errors import NotifyQueueError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Checked before Python's generic flags so the error names the specific reason; the ranges are
# listed explicitly because `is_private` changed meaning between Python patch releases.
_METADATA_ADDRESSES = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_PRIVATE_NETWORKS: tuple[IPNetwork, ...] = (
    ipaddress.ip_network("10.0.0.0/8"),
    ipaddress.ip_network("172.16.0.0/12"),
    ipaddress.ip_network("192.168.0.0/16"),
    ipaddress.ip_network("fc00::/7"),
)


class OutboundRefused(NotifyQueueError):
    """An outbound call would reach an address that is not public and not allowed."""

    def __init__(self, host: str, reason: str) -> None:
        self.host = host
        self.reason = reason
        super().__init__(f"outbound call to {host!r} refused: {reason}")


def forbidden_reason(address: IPAddress) -> str | None:
    """Why `address` may not be dialled without an allow-list entry, or None if it is public."""
    # An IPv4 address wrapped in IPv6 reaches the IPv4 host, so judge the IPv4 address.
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is not None:
            reason = forbidden_reason(embedded)
            return None if reason is None else f"{reason} (embedded in {address})"
    if address.is_unspecified:
        return f"{address} is the unspecified address"
    if address.is_loopback:
        return f"{address} is a loopback address"
    if address in _METADATA_ADDRESSES:
        return f"{address} is the cloud metadata service"
    if address.is_link_local:
        return f"{address} is a link-local address"
    if address.is_multicast:
        return f"{address} is a multicast address"
    if address in _CGNAT:
        return f"{address} is a carrier-grade NAT address"
    if any(address in network for network in _PRIVATE_NETWORKS):
        return f"{address} is a private address"
    if address.is_reserved:
        return f"{address} is a reserved address"
    if not address.is_global:
        # Documentation, benchmarking and other special-purpose ranges: nothing a webhook lives on.
        return f"{address} is not a globally routable address"
    return None


@dataclass(frozen=True, slots=True)
class OutboundAllowList:
    """Holes in the guard: networks matched against addresses, names matched against URL hosts."""

    networks: tuple[IPNetwork, ...] = ()
    host_names: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> OutboundAllowList:
        networks: list[IPNetwork] = []
        names: set[str] = set()
        for raw in entries:
            entry = raw.strip()
            if not entry:
                continue
            try:
                # strict=False: "10.1.2.3/8" means the network around it, as people write it.
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                names.add(_normalise_host(entry))
        return cls(tuple(networks), frozenset(names))

    def allows_host(self, host: str) -> bool:
        return _normalise_host(host) in self.host_names

    def allows_address(self, address: IPAddress) -> bool:
        return any(address in network for network in self.networks)

    def check_address(self, host: str, address: IPAddress) -> None:
        """Raise OutboundRefused unless `address` (reached through `host`) may be dialled."""
        if self.allows_address(address):
            return
        reason = forbidden_reason(address)
        if reason is not None:
            raise OutboundRefused(host, reason)


def _normalise_host(host: str) -> str:
    # DNS names are case-insensitive and "example.com." is the same name as "example.com".
    return host.lower().rstrip(".")


def _parse_ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver, refusing names that resolve to addresses the allow-list lacks."""

    def __init__(self, allow: OutboundAllowList, inner: AbstractResolver | None = None) -> None:
        self._allow = allow
        self._inner = inner if inner is not None else aiohttp.DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        if self._allow.allows_host(host):
            return results
        for result in results:
            address = _parse_ip(result["host"])
            if address is None:
                raise OutboundRefused(host, f"resolved to unparsable address {result['host']!r}")
            # Refuse the whole name rather than drop the bad address: a name that mixes public
            # and internal addresses is a rebinding attempt or a misconfiguration, never intended.
            self._allow.check_address(host, address)
        return results

    async def close(self) -> None:
        await self._inner.close()


class _GuardedConnector(aiohttp.TCPConnector):
    """A TCPConnector that closes the resolver it was given (aiohttp leaves that to the caller)."""

    def __init__(self, *, resolver: GuardedResolver) -> None:
        super().__init__(resolver=resolver, limit=0)
        self._guarded_resolver = resolver

    async def close(self, *, abort_ssl: bool = False) -> None:
        try:
            await super().close(abort_ssl=abort_ssl)
        finally:
            await self._guarded_resolver.close()


def _literal_ip_guard(allow: OutboundAllowList) -> aiohttp.ClientMiddlewareType:
    async def guard(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        host = request.url.raw_host or ""
        address = _parse_ip(host)
        if address is not None and not allow.allows_host(host):
            allow.check_address(host, address)
        return await handler(request)

    return guard


# Both sessions leave the number of connections to their callers (limit=0): the worker's
# --concurrency and the relay's POST slots already bound what is in flight, and aiohttp's default
# pool of 100 would make call 101 wait for a connection inside its own timeout. A delivery timed
# out that way was never sent, yet would count as a timeout (an unknown outcome); a webhook event
# would fail without ever being POSTed.


def outbound_session(
    *,
    allow: list[str],
    timeout_seconds: float,
    resolver: AbstractResolver | None = None,
) -> aiohttp.ClientSession:
    """A session for calls to URLs we do not control; call it inside the running event loop.

    `allow` holds CIDRs and host names that may be reached although they are not public.
    `resolver` replaces aiohttp's default DNS resolver under the guard (tests use a fixed table).
    Requests raise `OutboundRefused` for a forbidden destination, before anything is sent to it.
    """
    allow_list = OutboundAllowList.parse(allow)
    return aiohttp.ClientSession(
        connector=_GuardedConnector(resolver=GuardedResolver(allow_list, resolver)),
        timeout=aiohttp.ClientTimeout(total=timeout_seconds),
        middlewares=(_literal_ip_guard(allow_list),),
        # Environment proxies would make the proxy, not the destination, the address we dial.
        trust_env=False,
    )


def trusted_session(*, timeout_seconds: float) -> aiohttp.ClientSession:
    """A session for endpoints the person running the system configured: no address guard.

    Still no environment proxies and no redirects followed by the callers, so a configured URL
    is exactly where the content goes.
    """
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=timeout_seconds),
        trust_env=False,
    )


# Enough for any provider's JSON answer; a peer streaming gigabytes cannot exhaust a worker.
RESPONSE_BODY_LIMIT_BYTES = 64 * 1024
# How much of a failed response's body goes into `lastError`: enough to show the peer's reason.
ERROR_BODY_CHARS = 200


async def read_body_capped(
    response: aiohttp.ClientResponse, limit_bytes: int = RESPONSE_BODY_LIMIT_BYTES
) -> bytes:
    """At most `limit_bytes` of the body; the rest stays unread and goes with the connection."""
    body = bytearray()
    while len(body) < limit_bytes:
        chunk = await response.content.read(limit_bytes - len(body))
        if not chunk:
            break
        body += chunk
    return bytes(body)


def describe_failed_response(status: int, body: bytes) -> str:
    """`HTTP 503: <start of body>`, the form `lastError` and webhook errors carry."""
    text = body[: ERROR_BODY_CHARS * 4].decode("utf-8", errors="replace").strip()
    text = " ".join(text.split())[:ERROR_BODY_CHARS]
    return f"HTTP {status}: {text}" if text else f"HTTP {status}"
