"""Outbound HTTP safety: URLs that clients supply must not reach the inside of our network.

Trust follows who chose the URL. Endpoints set by whoever installs and runs the system (provider
URLs, the SMTP host, `--webhook-url`) are reached wherever they are: in a cluster the SMS gateway
or the mail relay is usually a Service on a private address (`trusted_session` for providers,
`posting.trusted_poster` for the operator's webhook). URLs that API clients or namespace users
supply (a notification's `webhookUrl`, a NotificationPolicy's webhook) go through the guard
(`posting.guarded_poster`): without it anyone who can create a notification could make a worker
POST to the cloud metadata service, to PostgreSQL's neighbours or to loopback admin ports
(server-side request forgery). The check has to happen on the address actually dialled, not on
the URL text, because a public-looking name can resolve to 10.0.0.5 (or re-resolve to it later:
DNS rebinding). This module holds the two checks the relay's client applies:

* `GuardedResolver` wraps a resolver and refuses the name when any address it resolves to is not
  public; the client only ever dials what it returned;
* `literal_ip_verdict` judges a URL whose host is a literal IP address (nothing to resolve).

Redirects are never followed, so a redirect to `http://169.254.169.254/` reaches nothing.

The guard is consulted once per host and TTL, not per request: the resolver keeps each verdict
(the vetted addresses, or the refusal) for `GUARD_TTL_SECONDS` per host, port and family.
Keeping the vetted answer opens no rebinding hole: within the TTL the client dials the addresses
that were vetted, whatever the name resolves to meanwhile, and after it the name is resolved and
vetted again before the next dial. Connections are kept alive per host, so a steady stream of
events to one receiver neither dials nor resolves again.

`allow` opens holes on purpose (a receiver on loopback in development, a provider on a private
network): an entry is a CIDR, matched against the resolved address, or a host name, matched
against the name in the URL.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from notify_queue.errors import NotifyQueueError
from notify_queue.models import DeliveryResult, Outcome

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


def parse_ip(text: str) -> IPAddress | None:
    """The address if `text` is a literal IP address, else None (a name)."""
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


# How long a host's verdict (its vetted addresses, or its refusal) is kept. The system resolver
# does not tell us a record's TTL, so a fixed minute: long enough that a busy receiver is vetted
# about once a minute instead of once per event, short enough that a moved receiver is followed
# soon and a name fixed to point at a public address is accepted within a minute.
GUARD_TTL_SECONDS = 60.0
# Verdicts kept at most; past it the expired ones go, and if none has expired, all of them.
_VERDICTS_MAX = 4096


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver, refusing names that resolve to addresses the allow-list lacks.

    Each verdict is kept `ttl_seconds` per (host, port, family): within it the same vetted
    addresses are returned (so the connector dials only those) or the same refusal is raised,
    without asking DNS again. `ttl_seconds=0` vets on every call. Resolution errors are not kept.
    """

    def __init__(
        self,
        allow: OutboundAllowList,
        inner: AbstractResolver | None = None,
        *,
        ttl_seconds: float = GUARD_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._allow = allow
        self._inner = inner if inner is not None else aiohttp.DefaultResolver()
        self._ttl_seconds = ttl_seconds
        self._clock = clock
        # (host, port, family) -> (expires at, vetted addresses or the refusal's reason)
        self._verdicts: dict[tuple[str, int, int], tuple[float, list[ResolveResult] | str]] = {}

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        key = (host, port, int(family))
        now = self._clock()
        kept = self._verdicts.get(key)
        if kept is not None and kept[0] > now:
            verdict = kept[1]
        else:
            verdict = await self._vet(host, port, family)
            if self._ttl_seconds > 0:
                self._keep(key, now + self._ttl_seconds, verdict)
        if isinstance(verdict, str):
            raise OutboundRefused(host, verdict)
        # A copy: aiohttp may reorder what it is given, and the kept answer must stay as vetted.
        return list(verdict)

    async def _vet(
        self, host: str, port: int, family: socket.AddressFamily
    ) -> list[ResolveResult] | str:
        """The resolved addresses if every one of them may be dialled, else why not."""
        results = await self._inner.resolve(host, port, family)
        if self._allow.allows_host(host):
            return results
        for result in results:
            address = parse_ip(result["host"])
            if address is None:
                return f"resolved to unparsable address {result['host']!r}"
            # Refuse the whole name rather than drop the bad address: a name that mixes public
            # and internal addresses is a rebinding attempt or a misconfiguration, never intended.
            try:
                self._allow.check_address(host, address)
            except OutboundRefused as exc:
                return exc.reason
        return results

    def _keep(
        self, key: tuple[str, int, int], expires_at: float, verdict: list[ResolveResult] | str
    ) -> None:
        if len(self._verdicts) >= _VERDICTS_MAX:
            now = self._clock()
            for old in [k for k, (expiry, _) in self._verdicts.items() if expiry <= now]:
                del self._verdicts[old]
            if len(self._verdicts) >= _VERDICTS_MAX:
                self._verdicts.clear()
        self._verdicts[key] = (expires_at, verdict)

    async def close(self) -> None:
        await self._inner.close()


def literal_ip_verdict(allow: OutboundAllowList, host: str) -> str | None:
    """Why a URL whose host is this literal IP address is refused; None for a name (the
    resolver's to vet) or an address the allow-list lets through."""
    address = parse_ip(host)
    if address is None or allow.allows_host(host):
        return None
    try:
        allow.check_address(host, address)
    except OutboundRefused as exc:
        return exc.reason
    return None


# The providers' session leaves the number of connections to its caller (limit=0): the worker's
# --concurrency already bounds what is in flight, and aiohttp's default pool of 100 would make
# call 101 wait for a connection inside its own timeout. A delivery timed out that way was never
# sent, yet would count as a timeout (an unknown outcome).


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


def transport_failure(
    exc: TimeoutError | aiohttp.ClientError, *, timeout_seconds: float, url_is: str
) -> DeliveryResult:
    """What a call that got no answer delivered: a timeout or a lost connection is temporary (a
    connection never made sent nothing), a malformed URL (`url_is` names it) permanent."""
    if isinstance(exc, TimeoutError):
        # aiohttp's own timeout errors subclass asyncio.TimeoutError, which is TimeoutError.
        return DeliveryResult(
            Outcome.TEMPORARY_FAILURE, error=f"timed out after {timeout_seconds:g}s"
        )
    if isinstance(exc, aiohttp.InvalidURL):
        return DeliveryResult(Outcome.PERMANENT_FAILURE, error=f"invalid {url_is}: {exc}")
    return DeliveryResult(
        Outcome.TEMPORARY_FAILURE,
        error=f"connection error: {type(exc).__name__}: {exc}",
        # The connection was never made (refused, unreachable, DNS): nothing was sent.
        nothing_sent=isinstance(exc, aiohttp.ClientConnectorError),
    )
