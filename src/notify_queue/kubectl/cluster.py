"""The plugin's calls to the Kubernetes API, with the user's own credentials.

The official `kubernetes` package loads the kubeconfig (contexts, client certificates, tokens,
exec plugins, in-cluster service accounts) and makes the requests. Every call goes through one
`request` method that answers plain JSON (dicts, as `kubectl get -o json` shows them), so the
commands read objects the way users see them, and every refusal becomes one `PluginError` whose
message is a single line naming the object and what the API server said.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from notify_queue.services.kube import GROUP, NOTIFICATIONS, POLICIES, VERSION

MERGE_PATCH = "application/merge-patch+json"
IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
CUSTOM = f"/apis/{GROUP}/{VERSION}"


class PluginError(Exception):
    """What the user did or asked cannot be done; the message is the whole, one-line answer."""


class KubeRequestFailed(PluginError):
    """The API server (or, through its proxy, the HTTP API) answered with an error status."""

    def __init__(self, message: str, *, status: int, body: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


@dataclass(frozen=True)
class Target:
    """Where the plugin points: the kubeconfig and context to use, the default namespace."""

    kubeconfig: Path | None = None
    context: str | None = None
    namespace: str | None = None
    request_timeout_seconds: float = 30.0


def _default_namespace(target: Target, in_cluster: bool) -> str:
    if target.namespace:
        return target.namespace
    if in_cluster:
        try:
            return IN_CLUSTER_NAMESPACE.read_text().strip() or "default"
        except OSError:
            return "default"
    import kubernetes.config

    contexts, active = kubernetes.config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
        config_file=str(target.kubeconfig) if target.kubeconfig else None
    )
    chosen = active
    if target.context:
        chosen = next((c for c in contexts if c.get("name") == target.context), None)
        if chosen is None:
            raise PluginError(f'context "{target.context}" does not exist in the kubeconfig')
    return str(((chosen or {}).get("context") or {}).get("namespace") or "default")


def message_of(body: Any, fallback: str) -> str:
    """The one sentence of an error body: a Kubernetes Status, an API problem, or the text."""
    if isinstance(body, dict):
        text = body.get("message") or body.get("detail") or body.get("title")
        if text:
            return " ".join(str(text).split())
    if isinstance(body, str) and body.strip():
        return " ".join(body.split())[:300]
    return fallback


class Cluster:
    """The user's cluster, through their kubeconfig (or the pod's service account)."""

    def __init__(self, target: Target) -> None:
        import kubernetes.client
        import kubernetes.config

        configuration = kubernetes.client.Configuration()
        in_cluster = (
            target.kubeconfig is None
            and not os.environ.get("KUBECONFIG")
            and not (Path.home() / ".kube" / "config").exists()
        )
        try:
            if in_cluster:
                kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration
                )
            else:
                kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=str(target.kubeconfig) if target.kubeconfig else None,
                    context=target.context,
                    client_configuration=configuration,
                    persist_config=False,
                )
        except kubernetes.config.ConfigException as exc:
            raise PluginError(f"no usable Kubernetes credentials: {exc}") from None
        self.namespace = _default_namespace(target, in_cluster)
        self._timeout = target.request_timeout_seconds
        self._client = kubernetes.client.ApiClient(configuration)

    def close(self) -> None:
        self._client.close()  # type: ignore[no-untyped-call]

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: Any = None,
        headers: dict[str, str] | None = None,
        what: str = "",
    ) -> Any:
        """One call; the answer's JSON (or its text when it is not JSON).

        `what` names the object in error messages ("notification shop/welcome")."""
        import urllib3

        header_params = {"Accept": "application/json", **(headers or {})}
        if body is not None and "Content-Type" not in header_params:
            header_params["Content-Type"] = "application/json"
        try:
            status, reason, data = self._send(method, path, query or {}, header_params, body)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            host = self._client.configuration.host
            raise PluginError(f"cannot reach the Kubernetes API at {host}: {exc}") from None
        parsed = _parse(data)
        if 200 <= status < 300:
            return parsed
        subject = what or path
        if status == 404 and isinstance(parsed, dict) and parsed.get("kind") == "Status":
            raise KubeRequestFailed(f"{subject} not found", status=404, body=parsed)
        message = message_of(parsed, f"HTTP {status} {reason}")
        raise KubeRequestFailed(f"{subject}: {message}", status=status, body=parsed)

    def _send(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        headers: dict[str, str],
        body: Any,
    ) -> tuple[int, str, bytes]:
        """(status, reason, body) of one request, whatever the status, signed with the
        kubeconfig's credentials (a refreshed exec-plugin token included)."""
        import kubernetes.client

        client: Any = self._client
        if hasattr(client, "param_serialize"):  # kubernetes >= 37 (the new generator)
            request = client.param_serialize(
                method,
                path,
                query_params=list(query.items()),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = client.call_api(*request, _request_timeout=self._timeout)
            response.read()
            return int(response.status), str(response.reason), bytes(response.data or b"")
        try:  # kubernetes < 37
            response = client.call_api(
                path,
                method,
                query_params=list(query.items()),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
                _request_timeout=self._timeout,
            )
            return int(response.status), str(response.reason), bytes(response.data or b"")
        except kubernetes.client.ApiException as exc:
            raw = exc.body.encode() if isinstance(exc.body, str) else bytes(exc.body or b"")
            return int(exc.status or 0), str(exc.reason), raw

    # --- the custom resources -------------------------------------------------------------

    def notification(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(
            self.request(
                "GET",
                f"{CUSTOM}/namespaces/{namespace}/{NOTIFICATIONS}/{quote(name)}",
                what=f"notification {namespace}/{name}",
            )
        )

    def notifications(self, namespace: str | None) -> list[dict[str, Any]]:
        """Every Notification of `namespace` (None: of all namespaces), page by page."""
        scope = f"/namespaces/{namespace}" if namespace else ""
        path = f"{CUSTOM}{scope}/{NOTIFICATIONS}"
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            query = {"limit": "500", **({"continue": token} if token else {})}
            page = self.request("GET", path, query=query, what="notifications")
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return items

    def policy(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return dict(
                self.request(
                    "GET",
                    f"{CUSTOM}/namespaces/{namespace}/{POLICIES}/{quote(name)}",
                    what=f"notificationpolicy {namespace}/{name}",
                )
            )
        except KubeRequestFailed as exc:
            if exc.status == 404:
                return None
            raise

    def annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> dict[str, Any]:
        return dict(
            self.request(
                "PATCH",
                f"{CUSTOM}/namespaces/{namespace}/{NOTIFICATIONS}/{quote(name)}",
                body={"metadata": {"annotations": annotations}},
                headers={"Content-Type": MERGE_PATCH},
                what=f"notification {namespace}/{name}",
            )
        )

    def whoami(self) -> str | None:
        """The user this kubeconfig authenticates as (a SelfSubjectReview, Kubernetes 1.28+),
        or None when the API server does not say (older, or the review is not allowed)."""
        try:
            review = self.request(
                "POST",
                "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
                what="selfsubjectreview",
            )
        except KubeRequestFailed:
            return None
        user = ((review or {}).get("status") or {}).get("userInfo") or {}
        name = user.get("username") if isinstance(user, dict) else None
        return str(name) if name else None

    # --- what the chart installs ----------------------------------------------------------

    def list(
        self, path: str, *, label_selector: str | None = None, what: str = ""
    ) -> list[dict[str, Any]]:
        query = {"labelSelector": label_selector} if label_selector else None
        return list(self.request("GET", path, query=query, what=what).get("items") or [])

    def get(self, path: str, *, what: str) -> dict[str, Any] | None:
        """The object at `path`, or None when it does not exist."""
        try:
            return dict(self.request("GET", path, what=what))
        except KubeRequestFailed as exc:
            if exc.status == 404:
                return None
            raise


def _parse(data: Any) -> Any:
    if isinstance(data, bytes | bytearray):
        data = data.decode("utf-8", "replace")
    if not isinstance(data, str):
        return data
    try:
        return json.loads(data)
    except ValueError:
        return data
