"""The kopf handlers, registered on a dedicated `kopf.OperatorRegistry` (never kopf's global one),
so several operators can run in one process, as the tests do.

The handlers are thin: they pass the object's fields to the mirrors and turn "try again later"
errors into `kopf.TemporaryError` with a short delay. Handlers are per-object by nature; the
per-change work (status write-back, TTL, scaling, re-reading the policies' Secrets) is done by
single tasks outside kopf. kopf watches our own kinds only: never Secrets or Deployments, which
the operator may not list or watch (docs/security.md).

A Notification carries no finalizer: its clean-up on delete (cancel a PENDING row, drop the link)
runs on the watch's DELETED event, and the status writer does it for an object it finds gone, so
the status patch stays the only write of a notification (docs/operator.md "Writes per
notification").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar, cast

import kopf

from notify_queue.errors import DatabaseUnavailable
from notify_queue.operator.kubeapi import KubeApi, KubeUnavailable
from notify_queue.operator.mirror import NotificationMirror, PolicyMirror, TemplateMirror
from notify_queue.services.kube import (
    ACKNOWLEDGED,
    GROUP,
    NOTIFICATIONS,
    POLICIES,
    TEMPLATES,
    VERSION,
    acknowledged_by,
)

F = TypeVar("F", bound=Callable[..., Any])

# Seconds before kopf retries a handler that failed for a reason that passes (database or API
# server away); kopf's own default (60 s) would leave a Notification unmirrored for a minute.
RETRY_DELAY_SECONDS = 2.0


async def _retrying(call: Callable[[], Awaitable[Any]]) -> Any:
    try:
        return await call()
    except (DatabaseUnavailable, KubeUnavailable) as exc:
        raise kopf.TemporaryError(str(exc), delay=RETRY_DELAY_SECONDS) from None


def register_handlers(
    registry: kopf.OperatorRegistry,
    *,
    kube: KubeApi,
    forget: Callable[[str], None],
    notifications: NotificationMirror,
    policies: PolicyMirror,
    templates: TemplateMirror | None = None,
) -> None:
    def on(decorator: Callable[..., Any], plural: str, handler_id: str) -> Callable[[F], F]:
        # One place for what every handler shares: our registry, an explicit id (kopf's default
        # is the function's qualified name) and the short retry delay.
        return cast(
            Callable[[F], F],
            decorator(
                GROUP,
                VERSION,
                plural,
                id=handler_id,
                registry=registry,
                backoff=RETRY_DELAY_SECONDS,
            ),
        )

    @kopf.on.login(id="login", registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kube.connection_info()

    # --- Notification ----------------------------------------------------------------------

    @on(kopf.on.create, NOTIFICATIONS, "notification_created")
    async def notification_created(
        namespace: str,
        name: str,
        uid: str,
        meta: kopf.Meta,
        spec: kopf.Spec,
        status: kopf.Status,
        **_: Any,
    ) -> None:
        if status.get("phase"):
            # Mirrored before (or rejected): a restarted operator, whose kopf bookkeeping is in
            # memory (storage.py), sees every object as new.
            return
        await _retrying(
            lambda: notifications.created(
                namespace=namespace,
                name=name,
                uid=uid,
                generation=int(meta.get("generation", 1)),
                spec=dict(spec),
                annotations=dict(meta.get("annotations") or {}),
            )
        )

    # `kubectl notify ack` (or `kubectl annotate ... notifyqueue.io/acknowledged=true`): kopf
    # leaves annotations under its own storage prefix (ours, notifyqueue.io) out of the objects'
    # essence, so an update handler would never see this one change; naming it as the field
    # (a key path: the annotation's name holds dots) brings it back in, and the handler runs
    # when its value becomes "true" (at creation too: then after the create handler, which
    # acknowledges such an object itself once it is mirrored, see `NotificationMirror.created`).
    @kopf.on.field(
        GROUP,
        VERSION,
        NOTIFICATIONS,
        id="notification_acknowledged",
        registry=registry,
        backoff=RETRY_DELAY_SECONDS,
        field=("metadata", "annotations", ACKNOWLEDGED),
        new="true",
    )
    async def notification_acknowledged(
        namespace: str | None, name: str, uid: str, annotations: Mapping[str, str], **_: Any
    ) -> None:
        by = acknowledged_by(annotations) or "kubernetes"
        await _retrying(
            lambda: notifications.acknowledged(namespace=namespace or "", name=name, uid=uid, by=by)
        )

    # Only the DELETED event reaches these handlers (`when`): kopf logs every handler it runs.
    def deleted_event(type: str, **_: Any) -> bool:
        return type == "DELETED"

    @kopf.on.event(
        GROUP, VERSION, NOTIFICATIONS, id="notification_gone", registry=registry, when=deleted_event
    )
    async def notification_gone(uid: str, **_: Any) -> None:
        forget(uid)
        # kopf never retries an event handler: a database outage is waited out here.
        while True:
            try:
                await notifications.deleted(uid=uid)
                return
            except DatabaseUnavailable:
                await asyncio.sleep(RETRY_DELAY_SECONDS)

    # --- NotificationPolicy and NotificationTemplate: mirrored the same way -------------------

    def mirror(plural: str, kind: str, target: PolicyMirror | TemplateMirror) -> None:
        @on(kopf.on.resume, plural, f"{kind}_changed")
        @on(kopf.on.create, plural, f"{kind}_changed")
        @on(kopf.on.update, plural, f"{kind}_changed")
        async def changed(
            namespace: str,
            name: str,
            uid: str,
            meta: kopf.Meta,
            spec: kopf.Spec,
            status: kopf.Status,
            **_: Any,
        ) -> None:
            await _retrying(
                lambda: target.changed(
                    namespace=namespace,
                    name=name,
                    uid=uid,
                    generation=int(meta.get("generation", 1)),
                    spec=dict(spec),
                    conditions=list(status.get("conditions") or ()),
                )
            )

        @on(kopf.on.delete, plural, f"{kind}_deleted")
        async def deleted(namespace: str, name: str, **_: Any) -> None:
            await _retrying(lambda: target.deleted(namespace=namespace, name=name))

        @kopf.on.event(
            GROUP, VERSION, plural, id=f"{kind}_gone", registry=registry, when=deleted_event
        )
        def gone(uid: str, **_: Any) -> None:
            forget(uid)

    mirror(POLICIES, "policy", policies)
    if templates is not None:
        mirror(TEMPLATES, "template", templates)
