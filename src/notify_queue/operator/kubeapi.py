"""The operator's own calls to the Kubernetes API, outside kopf's handlers.

kopf watches and patches the objects it handles; the status writer, the TTL sweeper, the scaler
and the policy mirror need a few more calls (a status patch of any object, a delete with a uid
precondition, a Secret, the worker Deployments and their scale subresource, Events). They are
made here with aiohttp, on the event loop, with the same credentials kopf logs in with: the
official `kubernetes` package only loads the configuration (kubeconfig, exec plugins, in-cluster
service account), it never makes a request, so no thread pool sits between us and the API.

Every request path is built by `api_path` from percent-quoted segments: a name that holds a `/`
or is `..` can never name another object or namespace (docs/security.md).
"""

from __future__ import annotations

import asyncio
import base64
import enum
import json as _json
import logging
import os
import ssl
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import kopf

from notify_queue.errors import ConfigurationError, NotifyQueueError
from notify_queue.services.kube import GROUP, VERSION
from notify_queue.services.kube_status import kube_time

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
COMPONENT = "notify-queue-operator"


class KubeUnavailable(NotifyQueueError):
    """The API server could not be reached or answered 5xx/429; the caller retries later."""


class KubeRefused(NotifyQueueError):
    """The API server refused a request for good (4xx other than 404/409/429)."""


class PatchOutcome(enum.StrEnum):
    PATCHED = "patched"
    # The object is gone, or a new object with another uid took its name: nothing to write to.
    GONE = "gone"


@dataclass(frozen=True, slots=True)
class WorkerPool:
    """A Deployment labelled notifyqueue.io/worker-pool, as the scaler needs it."""

    namespace: str
    name: str
    uid: str
    replicas: int
    annotations: dict[str, str]


def api_path(*segments: str) -> str:
    """`/seg/seg/...` with every segment percent-quoted (a `/` stays inside its segment); an
    empty, `.` or `..` segment is refused, since a server or client would fold it into its
    neighbour."""
    for segment in segments:
        if segment in ("", ".", ".."):
            raise KubeRefused(f"not an API path segment: {segment!r} in {segments!r}")
    return "/" + "/".join(quote(segment, safe="") for segment in segments)


def _objects(plural: str, namespace: str | None) -> tuple[str, ...]:
    # The segments of one of our collections, in a namespace or (None) in all of them.
    where = ("namespaces", namespace) if namespace is not None else ()
    return ("apis", GROUP, VERSION, *where, plural)


def load_kube_configuration(kubeconfig: Path | None = None) -> Any:
    """A `kubernetes.client.Configuration`: from `kubeconfig`, else $KUBECONFIG or
    ~/.kube/config, else the in-cluster service account."""
    import kubernetes.client
    import kubernetes.config

    configuration = kubernetes.client.Configuration()
    use_kubeconfig = (
        kubeconfig is not None
        or bool(os.environ.get("KUBECONFIG"))
        or (Path.home() / ".kube" / "config").exists()
    )
    try:
        if use_kubeconfig:
            # config_file None: the library reads $KUBECONFIG (a ':'-separated list is merged,
            # as kubectl does) or ~/.kube/config.
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(kubeconfig) if kubeconfig is not None else None,
                client_configuration=configuration,
                persist_config=False,
            )
        else:
            kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
    except kubernetes.config.ConfigException as exc:
        raise ConfigurationError([f"no Kubernetes credentials: {exc}"]) from None
    return configuration


class KubeApi:
    """A few REST calls with the operator's credentials; create and close on the running loop."""

    def __init__(self, configuration: Any, *, request_timeout_seconds: float = 30.0) -> None:
        self._configuration = configuration
        self.server = str(configuration.host).rstrip("/")
        self._ssl: ssl.SSLContext | bool
        if str(configuration.host).startswith("https"):
            context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
            if configuration.cert_file:
                context.load_cert_chain(configuration.cert_file, configuration.key_file)
            if not configuration.verify_ssl:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            self._ssl = context
        else:
            self._ssl = False
        # Strong references to fire-and-forget Event posts (asyncio keeps only weak ones).
        self._background: set[asyncio.Task[None]] = set()
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=request_timeout_seconds),
            connector=aiohttp.TCPConnector(ssl=self._ssl, limit=32),
        )

    async def flush_events(self, timeout_seconds: float = 5.0) -> None:
        """Wait (a while) for Events still being posted."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=timeout_seconds)

    async def close(self) -> None:
        await self.flush_events()
        await self._session.close()

    # --- credentials -------------------------------------------------------------------------

    def _authorization(self) -> str | None:
        # Asked per request: an in-cluster token is re-read by the client's refresh hook.
        c = self._configuration
        header = c.get_api_key_with_prefix("BearerToken") or c.get_api_key_with_prefix(
            "authorization"
        )
        return str(header) if header else None

    def connection_info(self) -> kopf.ConnectionInfo:
        """The same credentials for kopf (its login handler)."""
        c = self._configuration
        header = self._authorization()
        scheme, _, token = (header or "").partition(" ")
        return kopf.ConnectionInfo(
            server=self.server,
            ca_path=c.ssl_ca_cert or None,
            insecure=not c.verify_ssl,
            scheme=scheme or None,
            token=token or None,
            certificate_path=c.cert_file or None,
            private_key_path=c.key_file or None,
            username=c.username or None,
            password=c.password or None,
        )

    # --- the transport -------------------------------------------------------------------------

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
        tolerated: tuple[int, ...] = (404, 409),
    ) -> tuple[int, Any]:
        """(status, parsed body) of a call; 5xx, 429, 401 and 403 raise KubeUnavailable (try
        again later: an overloaded server, credentials being refreshed, RBAC being fixed), a
        redirect and other 4xx not in `tolerated` raise KubeRefused."""
        headers = {"Accept": "application/json"}
        if json is not None:
            headers["Content-Type"] = content_type
        if auth := self._authorization():
            headers["Authorization"] = auth
        try:
            # No redirects: a request goes to the path built here (api_path) or nowhere.
            async with self._session.request(
                method,
                self.server + path,
                json=json,
                params=params,
                headers=headers,
                allow_redirects=False,
            ) as response:
                text = await response.text()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise KubeUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from None
        try:
            body = _json.loads(text) if text else None
        except ValueError:
            body = text  # a proxy's HTML error page, say: kept for the message
        if status >= 500 or status in (401, 403, 429):
            raise KubeUnavailable(f"{method} {path}: HTTP {status}: {_message(body)}")
        if 300 <= status < 400:
            raise KubeRefused(f"{method} {path}: HTTP {status}: redirected, not followed")
        if status >= 400 and status not in tolerated:
            raise KubeRefused(f"{method} {path}: HTTP {status}: {_message(body)}")
        return status, body

    # --- Notifications and policies --------------------------------------------------------------

    async def status_patch(
        self, *, plural: str, namespace: str, name: str, uid: str, status: dict[str, Any]
    ) -> PatchOutcome:
        """Set the object's whole .status, only if it is still the object with `uid`.

        A JSON patch whose first operation tests metadata.uid: the status subresource ignores
        metadata in a merge patch, so a uid there would be no precondition at all. A failed test
        is a 422 without details; a GET then tells it from a status the schema refused.
        """
        path = api_path(*_objects(plural, namespace), name, "status")
        operations = [
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "add", "path": "/status", "value": _without_nulls(status)},
        ]
        code, body = await self._request(
            "PATCH", path, json=operations, content_type=JSON_PATCH, tolerated=(404, 422)
        )
        if code == 404:
            return PatchOutcome.GONE
        if code == 422:
            current = await self.custom_object_get(plural=plural, namespace=namespace, name=name)
            if current is None or current["metadata"].get("uid") != uid:
                return PatchOutcome.GONE
            raise KubeRefused(f"PATCH {path}: HTTP 422: {_message(body)}")
        return PatchOutcome.PATCHED

    async def custom_object_get(
        self, *, plural: str, namespace: str, name: str
    ) -> dict[str, Any] | None:
        code, body = await self._request("GET", api_path(*_objects(plural, namespace), name))
        return None if code == 404 else dict(body)

    async def custom_object_delete(
        self, *, plural: str, namespace: str, name: str, uid: str
    ) -> bool:
        """Delete the object if it is still the one with `uid`; False when it is already gone."""
        code, _ = await self._request(
            "DELETE",
            api_path(*_objects(plural, namespace), name),
            json={"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}},
        )
        return code not in (404, 409)

    async def custom_objects_list(
        self, *, plural: str, namespace: str | None
    ) -> list[dict[str, Any]]:
        """Every object of ours of this kind in `namespace` (None: all namespaces)."""
        _, body = await self._request("GET", api_path(*_objects(plural, namespace or None)))
        return list((body or {}).get("items", []))

    async def custom_object_uids(self, *, plural: str, namespace: str | None) -> set[str]:
        """The uids of every object of this kind in `namespace` (None: all), listed in pages."""
        uids: set[str] = set()
        token = ""
        while True:
            params = {"limit": "500", **({"continue": token} if token else {})}
            _, body = await self._request(
                "GET", api_path(*_objects(plural, namespace or None)), params=params
            )
            uids.update(item["metadata"]["uid"] for item in (body or {}).get("items", []))
            token = ((body or {}).get("metadata") or {}).get("continue") or ""
            if not token:
                return uids

    async def finalizer_remove(
        self, *, plural: str, namespace: str, name: str, uid: str, finalizer: str
    ) -> bool:
        """Drop one finalizer, only from the object with `uid` and only if the list is unchanged
        since it was read (JSON patch tests); False when the object changed or is gone."""
        body = await self.custom_object_get(plural=plural, namespace=namespace, name=name)
        if body is None or body["metadata"].get("uid") != uid:
            return False
        current = list(body["metadata"].get("finalizers") or [])
        if finalizer not in current:
            return True
        code, _ = await self._request(
            "PATCH",
            api_path(*_objects(plural, namespace), name),
            json=[
                {"op": "test", "path": "/metadata/uid", "value": uid},
                {"op": "test", "path": "/metadata/finalizers", "value": current},
                {
                    "op": "replace",
                    "path": "/metadata/finalizers",
                    "value": [f for f in current if f != finalizer],
                },
            ],
            content_type=JSON_PATCH,
            tolerated=(404, 409, 422),
        )
        return code < 400

    async def secret_value(self, *, namespace: str, name: str, key: str) -> str | None:
        """One key of a Secret, decoded; None when the Secret or the key does not exist."""
        code, body = await self._request(
            "GET", api_path("api", "v1", "namespaces", namespace, "secrets", name)
        )
        if code == 404:
            return None
        data = (body or {}).get("data") or {}
        if key not in data:
            return None
        return base64.b64decode(data[key]).decode("utf-8", errors="replace").strip()

    async def secret_data(self, *, namespace: str, name: str) -> dict[str, bytes] | None:
        """Every key of a Secret, decoded and exactly as stored; None when it does not exist."""
        code, body = await self._request(
            "GET", api_path("api", "v1", "namespaces", namespace, "secrets", name)
        )
        if code == 404:
            return None
        data = (body or {}).get("data") or {}
        return {key: base64.b64decode(value) for key, value in data.items()}

    async def secret_create(
        self,
        *,
        namespace: str,
        name: str,
        data: dict[str, bytes],
        labels: dict[str, str],
        annotations: dict[str, str],
    ) -> bool:
        """Create an Opaque Secret; False when one of that name exists already (it is left as
        it is: a create never replaces)."""
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "type": "Opaque",
            "data": {key: base64.b64encode(value).decode("ascii") for key, value in data.items()},
        }
        code, _ = await self._request(
            "POST",
            api_path("api", "v1", "namespaces", namespace, "secrets"),
            json=secret,
            tolerated=(409,),
        )
        return code != 409

    # --- worker pools ----------------------------------------------------------------------------

    async def worker_pools(self, *, namespace: str | None, label: str) -> list[WorkerPool]:
        where = ("namespaces", namespace) if namespace else ()
        path = api_path("apis", "apps", "v1", *where, "deployments")
        _, body = await self._request("GET", path, params={"labelSelector": label})
        pools = []
        for item in (body or {}).get("items", []):
            meta = item["metadata"]
            pools.append(
                WorkerPool(
                    namespace=meta["namespace"],
                    name=meta["name"],
                    uid=meta["uid"],
                    replicas=int(item.get("spec", {}).get("replicas", 1)),
                    annotations=dict(meta.get("annotations") or {}),
                )
            )
        return pools

    async def autoscalers(
        self, *, namespace: str | None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(HorizontalPodAutoscalers, KEDA ScaledObjects) in scope, as the API returns them.

        KEDA is optional: without its CRD the list is a 404, which means "none". Forbidden (the
        chart's RBAC grants both lists) is raised: scaling a pool that an unseen autoscaler
        also scales would be the fight this check exists to prevent.
        """
        where = ("namespaces", namespace) if namespace else ()
        lists = []
        for path in (
            api_path("apis", "autoscaling", "v2", *where, "horizontalpodautoscalers"),
            api_path("apis", "keda.sh", "v1alpha1", *where, "scaledobjects"),
        ):
            code, body = await self._request("GET", path, tolerated=(404,))
            lists.append([] if code == 404 else list((body or {}).get("items", [])))
        return lists[0], lists[1]

    async def deployment_scale(self, *, namespace: str, name: str, replicas: int) -> None:
        """Set the replica count through the scale subresource (what an autoscaler uses)."""
        await self._request(
            "PATCH",
            api_path("apis", "apps", "v1", "namespaces", namespace, "deployments", name, "scale"),
            json={"spec": {"replicas": replicas}},
            content_type=MERGE_PATCH,
        )

    async def deployment_replicas(self, *, namespace: str, name: str) -> int | None:
        """Pods the Deployment still has (status.replicas); None when it does not exist."""
        code, body = await self._request(
            "GET", api_path("apis", "apps", "v1", "namespaces", namespace, "deployments", name)
        )
        if code == 404:
            return None
        return int((body.get("status") or {}).get("replicas") or 0)

    # --- events --------------------------------------------------------------------------------

    async def event_post(
        self, *, involved: dict[str, str], type: str, reason: str, message: str
    ) -> None:
        """Post a core/v1 Event about `involved`; a failure is logged, never raised."""
        now = kube_time(datetime.now(UTC))
        namespace = involved["namespace"]
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{involved['name']}.{uuid.uuid4().hex[:12]}",
                "namespace": namespace,
            },
            "involvedObject": involved,
            "type": type,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": COMPONENT,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._request(
                "POST", api_path("api", "v1", "namespaces", namespace, "events"), json=event
            )
        except NotifyQueueError as exc:
            log.warning(
                "could not post Event %s for %s/%s: %s", reason, namespace, involved["name"], exc
            )

    def event_soon(self, *, involved: dict[str, str], type: str, reason: str, message: str) -> None:
        """Post an Event in the background (the caller does not wait for the API server)."""
        task = asyncio.create_task(
            self.event_post(involved=involved, type=type, reason=reason, message=message)
        )
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _without_nulls(status: dict[str, Any]) -> dict[str, Any]:
    # Unset fields are left out (a whole-status replacement has no use for nulls).
    return {k: v for k, v in status.items() if v is not None}


def _message(body: Any) -> str:
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return str(body)[:300]
