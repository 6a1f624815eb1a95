"""Reaching the HTTP API through the Kubernetes service proxy, with the chart's API token; or
directly, at `--api-url` (or $NOTIFY_QUEUE_API_URL), with the token in $NOTIFY_QUEUE_API_TOKEN and
$NOTIFY_QUEUE_ADMIN_TOKEN (the names the API reads), where no Service fronts the API: under
`notify-queue up --kubernetes` the API runs on this machine's loopback, which the API server
never proxies to.

Which Service: `--api-service NAMESPACE/NAME[:PORT]` when given; else the Service the chart
labels `app.kubernetes.io/part-of=notify-queue, app.kubernetes.io/component=api`, looked for in
the namespace at hand first and then in all namespaces (a user who may not list Services
cluster-wide is told to pass `--api-service`).

Which token: the one the API itself reads. The API Deployment (the one whose pods the Service
selects) names it in its environment: `NOTIFY_QUEUE_API_TOKEN` and `NOTIFY_QUEUE_ADMIN_TOKEN`,
each a literal value or a `secretKeyRef`. Following the Deployment rather than guessing Secret
names covers every way the chart wires the token (its own Secret, `existingSecret`,
`auth.existingSecret`, the generated `<release>-notify-queue-api-token`). When the Deployment
cannot be read, the chart's two Secret names for that Service are tried.

The token travels in `X-Notify-Queue-Token`, not `Authorization`: the API server deletes the
`Authorization` header of every request it authenticates before proxying it, so a bearer token
would never reach the API. The API accepts the header wherever it accepts the bearer token
(api/auth.py).
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from typing import Any

import httpx

from notify_queue.kubectl.cluster import Cluster, KubeRequestFailed, PluginError, message_of

# The API reads the same name (notify_queue.api.auth.TOKEN_HEADER); the plugin cannot import it
# (controllers are independent of each other).
TOKEN_HEADER = "X-Notify-Queue-Token"  # noqa: S105 - a header's name, not a token
API_LABELS = "app.kubernetes.io/part-of=notify-queue,app.kubernetes.io/component=api"
TOKEN_VARIABLES = {"api": "NOTIFY_QUEUE_API_TOKEN", "admin": "NOTIFY_QUEUE_ADMIN_TOKEN"}


class ApiUnavailable(PluginError):
    """The HTTP API cannot be reached or refused us; the message says why, in one line."""


@dataclass(frozen=True)
class ApiService:
    namespace: str
    name: str
    port: str

    @property
    def label(self) -> str:
        return f"service {self.namespace}/{self.name}:{self.port}"


@dataclass(frozen=True)
class Tokens:
    api: str | None
    admin: str | None
    source: str  # where they were found, for messages


def parse_service(text: str) -> tuple[str | None, str, str | None]:
    """`NAMESPACE/NAME[:PORT]` or `NAME[:PORT]` as (namespace, name, port)."""
    namespace, _, rest = text.rpartition("/")
    name, _, port = rest.partition(":")
    if not name:
        raise PluginError(f"--api-service {text!r}: expected NAMESPACE/NAME[:PORT]")
    return namespace or None, name, port or None


def _port_of(service: dict[str, Any]) -> str:
    ports = (service.get("spec") or {}).get("ports") or []
    if not ports:
        raise ApiUnavailable(f"service {service['metadata']['name']} has no port")
    named = [p for p in ports if p.get("name") == "http"] or ports
    return str(named[0].get("name") or named[0]["port"])


def find_service(cluster: Cluster, namespace: str, explicit: str | None) -> ApiService:
    if explicit:
        ns, name, port = parse_service(explicit)
        ns = ns or namespace
        service = cluster.get(
            f"/api/v1/namespaces/{ns}/services/{name}", what=f"service {ns}/{name}"
        )
        if service is None:
            raise ApiUnavailable(f"service {ns}/{name} not found")
        return ApiService(ns, name, port or _port_of(service))
    found = cluster.list(
        f"/api/v1/namespaces/{namespace}/services", label_selector=API_LABELS, what="services"
    )
    if not found:
        try:
            found = cluster.list("/api/v1/services", label_selector=API_LABELS, what="services")
        except KubeRequestFailed as exc:
            raise ApiUnavailable(
                f"no notify-queue API Service in namespace {namespace}, and listing Services "
                f"in all namespaces was refused ({exc}); pass --api-service NAMESPACE/NAME"
            ) from None
    if not found:
        raise ApiUnavailable(
            "no notify-queue API Service found (label app.kubernetes.io/component=api); "
            "pass --api-service NAMESPACE/NAME, or --api-url URL for an API no Service fronts "
            f"(notify-queue up --kubernetes: export {API_URL_VARIABLE}=http://127.0.0.1:8080)"
        )
    if len(found) > 1:
        names = ", ".join(f"{s['metadata']['namespace']}/{s['metadata']['name']}" for s in found)
        raise ApiUnavailable(f"several notify-queue API Services ({names}); pass --api-service")
    service = found[0]
    meta = service["metadata"]
    return ApiService(meta["namespace"], meta["name"], _port_of(service))


def _secret_value(cluster: Cluster, namespace: str, name: str, key: str) -> str | None:
    secret = cluster.get(
        f"/api/v1/namespaces/{namespace}/secrets/{name}", what=f"secret {namespace}/{name}"
    )
    value = ((secret or {}).get("data") or {}).get(key)
    return base64.b64decode(value).decode() if value else None


def _from_deployment(cluster: Cluster, service: ApiService, deployment: dict[str, Any]) -> Tokens:
    env = [
        variable
        for container in deployment["spec"]["template"]["spec"].get("containers") or []
        for variable in container.get("env") or []
    ]
    values: dict[str, str | None] = {}
    for role, variable in TOKEN_VARIABLES.items():
        entry = next((e for e in env if e.get("name") == variable), None)
        if entry is None:
            values[role] = None
        elif "value" in entry:
            values[role] = entry["value"] or None
        else:
            ref = (entry.get("valueFrom") or {}).get("secretKeyRef") or {}
            values[role] = (
                _secret_value(cluster, service.namespace, ref["name"], ref["key"])
                if ref.get("name") and ref.get("key")
                else None
            )
    name = deployment["metadata"]["name"]
    return Tokens(values["api"], values["admin"], f"deployment {service.namespace}/{name}")


def find_tokens(cluster: Cluster, service: ApiService) -> Tokens:
    svc = cluster.get(
        f"/api/v1/namespaces/{service.namespace}/services/{service.name}",
        what=f"service {service.namespace}/{service.name}",
    )
    selector = ((svc or {}).get("spec") or {}).get("selector") or {}
    try:
        deployments = cluster.list(
            f"/apis/apps/v1/namespaces/{service.namespace}/deployments", what="deployments"
        )
    except KubeRequestFailed as exc:
        if exc.status != 403:
            raise
        deployments = []
    for deployment in deployments:
        labels = ((deployment["spec"]["template"].get("metadata") or {}).get("labels")) or {}
        if selector and all(labels.get(k) == v for k, v in selector.items()):
            return _from_deployment(cluster, service, deployment)
    # The chart's names: <fullname>-api is the Service; the token is in the generated Secret
    # <fullname>-api-token, or in the chart-made <fullname>-secrets.
    fullname = service.name.removesuffix("-api")
    for secret in (f"{fullname}-api-token", f"{fullname}-secrets"):
        try:
            api = _secret_value(cluster, service.namespace, secret, "api-token")
            admin = _secret_value(cluster, service.namespace, secret, "admin-token")
        except KubeRequestFailed:
            continue
        if api or admin:
            return Tokens(api, admin, f"secret {service.namespace}/{secret}")
    return Tokens(None, None, "none found")


@dataclass(frozen=True)
class ApiChoice:
    """What the user said about where the API is: `--api-url` (else $NOTIFY_QUEUE_API_URL) or
    `--api-service`; neither: the Service is found by the chart's labels."""

    url: str | None = None
    service: str | None = None

    @classmethod
    def of(cls, url: str | None, service: str | None) -> ApiChoice:
        if url and service:
            raise PluginError("--api-url and --api-service name two APIs; give one")
        if not url and not service:
            url = os.environ.get(API_URL_VARIABLE) or None
        return cls(url.rstrip("/") if url else None, service)


API_URL_VARIABLE = "NOTIFY_QUEUE_API_URL"


class NotifyApi:
    """The HTTP API of one release, through `/api/v1/namespaces/NS/services/NAME:PORT/proxy`,
    or at a URL given directly (`service` is then None)."""

    def __init__(
        self,
        cluster: Cluster,
        service: ApiService | None,
        tokens: Tokens,
        *,
        url: str | None = None,
        timeout_seconds: float = 30.0,
    ) -> None:
        self._cluster = cluster
        self.service = service
        self.tokens = tokens
        self.url = url
        self._timeout = timeout_seconds

    @classmethod
    def connect(
        cls, cluster: Cluster, namespace: str, choice: ApiChoice, *, timeout_seconds: float = 30.0
    ) -> NotifyApi:
        if choice.url:
            tokens = Tokens(
                os.environ.get(TOKEN_VARIABLES["api"]) or None,
                os.environ.get(TOKEN_VARIABLES["admin"]) or None,
                f"${TOKEN_VARIABLES['api']} / ${TOKEN_VARIABLES['admin']}",
            )
            return cls(cluster, None, tokens, url=choice.url, timeout_seconds=timeout_seconds)
        try:
            service = find_service(cluster, namespace, choice.service)
            return cls(cluster, service, find_tokens(cluster, service))
        except ApiUnavailable:
            raise
        except PluginError as exc:
            raise ApiUnavailable(str(exc)) from None

    @property
    def label(self) -> str:
        return self.service.label if self.service is not None else str(self.url)

    def call(self, method: str, path: str, *, body: Any = None, admin: bool = False) -> Any:
        # Cancel and retry need the admin token when there is one; anything else takes either.
        token = (admin and self.tokens.admin) or self.tokens.api or self.tokens.admin
        if self.service is None:
            return self._direct(method, path, body=body, token=token)
        s = self.service
        try:
            return self._cluster.request(
                method,
                f"/api/v1/namespaces/{s.namespace}/services/{s.name}:{s.port}/proxy{path}",
                body=body,
                headers={TOKEN_HEADER: token} if token else None,
                what=f"{method} {path} through {self.label}",
            )
        except KubeRequestFailed as exc:
            if exc.status in (401, 403) and not _from_kubernetes(exc.body):
                raise ApiUnavailable(
                    f"the API refused the token from {self.tokens.source} "
                    f"(HTTP {exc.status}): {_detail(exc.body)}"
                ) from None
            if _from_kubernetes(exc.body) or exc.status >= 500:
                raise ApiUnavailable(str(exc)) from None
            raise

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def _direct(self, method: str, path: str, *, body: Any, token: str | None) -> Any:
        what = f"{method} {path} at {self.url}"
        try:
            response = httpx.request(
                method,
                f"{self.url}{path}",
                json=body,
                headers={TOKEN_HEADER: token} if token else None,
                timeout=self._timeout,
            )
        except httpx.HTTPError as exc:
            raise ApiUnavailable(f"cannot reach the API at {self.url}: {exc}") from None
        try:
            parsed: Any = response.json()
        except ValueError:
            parsed = response.text
        if response.is_success:
            return parsed
        if response.status_code in (401, 403):
            raise ApiUnavailable(
                f"the API refused the token from {self.tokens.source} "
                f"(HTTP {response.status_code}): {_detail(parsed)}"
            )
        message = message_of(parsed, f"HTTP {response.status_code}")
        if response.status_code >= 500:
            raise ApiUnavailable(f"{what}: {message}")
        raise KubeRequestFailed(f"{what}: {message}", status=response.status_code, body=parsed)


def _from_kubernetes(body: Any) -> bool:
    """Whether an error came from the API server itself (a Status), not from the HTTP API."""
    return isinstance(body, dict) and body.get("kind") == "Status"


def _detail(body: Any) -> str:
    if isinstance(body, dict):
        return str(body.get("detail") or body.get("title") or body)
    return str(body)[:200]
