"""Helpers for the operator tests: a small async Kubernetes client, manifests, the operator in a
thread and workers in-process."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from notify_queue.devcluster import LocalControlPlane
from notify_queue.operator.main import run_operator
from notify_queue.repositories.db import Database
from notify_queue.settings import OperatorSettings, UpSettings, WorkerSettings
from notify_queue.worker.main import run_worker

GROUP_VERSION = "notifyqueue.io/v1alpha1"
_PATHS = {
    "Notification": "/apis/notifyqueue.io/v1alpha1/namespaces/{ns}/notifications",
    "NotificationPolicy": "/apis/notifyqueue.io/v1alpha1/namespaces/{ns}/notificationpolicies",
    "NotificationTemplate": "/apis/notifyqueue.io/v1alpha1/namespaces/{ns}/notificationtemplates",
    "Secret": "/api/v1/namespaces/{ns}/secrets",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "Event": "/api/v1/namespaces/{ns}/events",
}


class Kube:
    """Just enough of the Kubernetes API for the tests, as the admin user."""

    def __init__(self, cluster: LocalControlPlane) -> None:
        self._server = cluster.server
        self._headers = {"Authorization": f"Bearer {cluster.token_for('admin')}"}
        self._ssl = ssl.create_default_context(cafile=str(cluster.ca_file))
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._ssl, limit=16),
            timeout=aiohttp.ClientTimeout(total=30),
        )

    async def close(self) -> None:
        await self._session.close()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Any = None,
        content_type: str = "application/json",
        ok: tuple[int, ...] = (200, 201),
    ) -> Any:
        headers = dict(self._headers)
        if json is not None:
            headers["Content-Type"] = content_type
        async with self._session.request(
            method, self._server + path, json=json, params=params, headers=headers
        ) as response:
            body = await response.json(content_type=None)
            if response.status not in ok:
                raise AssertionError(f"{method} {path}: HTTP {response.status}: {body}")
            return body

    async def namespace_create(self) -> str:
        name = f"t-{uuid.uuid4().hex[:10]}"
        await self._call(
            "POST",
            "/api/v1/namespaces",
            json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )
        return name

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        path = _PATHS[obj["kind"]].format(ns=obj["metadata"]["namespace"])
        return dict(await self._call("POST", path, json=obj))

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        path = _PATHS[kind].format(ns=namespace) + f"/{name}"
        body = await self._call("GET", path, ok=(200, 404))
        return None if body.get("kind") == "Status" else dict(body)

    async def list(self, kind: str, namespace: str, **params: str) -> list[dict[str, Any]]:
        body = await self._call("GET", _PATHS[kind].format(ns=namespace), params=params or None)
        return list(body["items"])

    async def delete(self, kind: str, namespace: str, name: str) -> None:
        await self._call(
            "DELETE", _PATHS[kind].format(ns=namespace) + f"/{name}", ok=(200, 202, 404)
        )

    async def patch(
        self, kind: str, namespace: str, name: str, patch: dict[str, Any], *, subresource: str = ""
    ) -> dict[str, Any]:
        path = (
            _PATHS[kind].format(ns=namespace)
            + f"/{name}"
            + (f"/{subresource}" if subresource else "")
        )
        return dict(
            await self._call("PATCH", path, json=patch, content_type="application/merge-patch+json")
        )

    async def events(self, namespace: str, *, name: str | None = None) -> list[dict[str, Any]]:
        events = await self.list("Event", namespace)
        return [e for e in events if name is None or e["involvedObject"].get("name") == name]


def notification(namespace: str, name: str | None = None, **spec: Any) -> dict[str, Any]:
    spec.setdefault("channel", "email")
    spec.setdefault("recipient", f"{uuid.uuid4().hex[:10]}@example.com")
    spec.setdefault("body", "hello from Kubernetes")
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "Notification",
        "metadata": {"name": name or f"n-{uuid.uuid4().hex[:10]}", "namespace": namespace},
        "spec": spec,
    }


def policy(namespace: str, name: str = "default", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "NotificationPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def condition(obj: dict[str, Any] | None, type: str) -> dict[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type:
            return dict(c)
    return None


def phase(obj: dict[str, Any] | None) -> str | None:
    return ((obj or {}).get("status") or {}).get("phase")


def settings_for(database_url: str, namespace: str | None, **overrides: Any) -> UpSettings:
    """Settings for an operator or a worker in a test (`up`'s are both): fast polls, short
    backoffs."""
    values: dict[str, Any] = {
        "database_url": database_url,
        "namespace": namespace,
        "status_patches_per_second": 500.0,
        "scale_interval": 0.3,
        # A rotated or late Secret is found by re-reading it (the operator may not watch them).
        "secret_refresh_interval": 0.5,
        "poll_interval": 0.2,
        "backoff_base": 0.05,
        "backoff_max": 0.2,
        "database_pool_size": 8,
        "outbound_allow": ["127.0.0.1/32"],
        "shutdown_grace_seconds": 1.0,
    }
    values.update(overrides)
    return UpSettings(**values)


class OperatorThread:
    """The real operator (`run_operator`) on its own event loop in a thread, as a pod runs it.

    A thread rather than a task of the test's loop: kopf, on shutdown, cancels every task its
    loop created after it started, which would include the test's workers.
    """

    def __init__(self, settings: OperatorSettings, kubeconfig: Path) -> None:
        self._settings = settings
        self._kubeconfig = kubeconfig
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="operator", daemon=True)
        self.error: BaseException | None = None

    def _main(self) -> None:
        try:
            asyncio.run(
                run_operator(
                    self._settings,
                    kubeconfig=self._kubeconfig,
                    stop_flag=self._stop,
                    ready_flag=self._ready,
                )
            )
        except BaseException as exc:
            self.error = exc
            self._ready.set()

    async def start(self, timeout: float = 60.0) -> OperatorThread:
        self._thread.start()
        if not await asyncio.to_thread(self._ready.wait, timeout):
            raise AssertionError(f"operator not ready within {timeout}s")
        if self.error is not None:
            raise self.error
        return self

    async def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        await asyncio.to_thread(self._thread.join, timeout)
        if self._thread.is_alive():
            raise AssertionError("operator did not stop")
        if self.error is not None:
            raise self.error


@contextlib.asynccontextmanager
async def running_worker(settings: WorkerSettings, db: Database) -> AsyncIterator[None]:
    """A real worker (`run_worker`) as a task of the test's loop, stopped on exit."""
    stop = asyncio.Event()
    task = asyncio.create_task(run_worker(settings, db=db, stop=stop))
    try:
        await asyncio.sleep(0)
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)
