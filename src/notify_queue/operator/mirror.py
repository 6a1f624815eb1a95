"""Mirroring objects into the queue: Notifications become rows, NotificationPolicies policies,
NotificationTemplates templates.

A Notification is enqueued through the same `NotificationService.enqueue` the HTTP API uses, with
source `kubernetes` and a key derived from its uid, so mirroring it again (an operator restart, a
re-list, a second replica) finds the same row instead of making a second. The link object→row
is saved with the first status write in one statement; from then on the status writer keeps
`.status` current. What the queue refuses becomes phase `Rejected`, written here, with the reason.

A Notification with `recipientId` becomes one row per channel (docs/operator.md): the object
links to the first, whose status its phase follows, and the status writer lists them all in
`status.notifications`.

A Notification with `spec.escalation` becomes an escalation through the same
`EscalationService.create` the API uses (same key, so mirroring it again finds it): the object
links to the escalation's LAST step, so its phase stays Pending while any step may still go
out, and ends Sent (every step went out) or Cancelled (acknowledged first). The annotation
`notifyqueue.io/acknowledged=true` acknowledges it (`acknowledged`); status.escalation shows the
escalation's id and state (docs/escalation.md, "Kubernetes").
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from notify_queue import tracing
from notify_queue.errors import Conflict, DatabaseUnavailable, NotFound, ValidationFailed
from notify_queue.models import Notification, Policy, Source
from notify_queue.operator import metrics
from notify_queue.operator.kubeapi import KubeApi, KubeRefused, KubeUnavailable
from notify_queue.operator.waiting import pause
from notify_queue.repositories.kube import KubeRepository
from notify_queue.repositories.policies import PolicyRepository
from notify_queue.services import kube as rules
from notify_queue.services.escalations import EscalationService
from notify_queue.services.kube_status import policy_status, rejected_status, template_status
from notify_queue.services.notifications import NotificationService
from notify_queue.services.recipients import RecipientService
from notify_queue.services.validation import PreparedRequest

log = logging.getLogger(__name__)


class NotificationMirror:
    def __init__(
        self,
        notifications: NotificationService,
        links: KubeRepository,
        kube: KubeApi,
        *,
        database_concurrency: int,
        escalations: EscalationService | None = None,
        default_region: str | None = None,
    ) -> None:
        self._notifications = notifications
        # The region of phone numbers written without `+` (--default-region).
        self._default_region = default_region
        self._links = links
        self._kube = kube
        self._escalations = escalations
        # kopf runs one handler per object at once: after a restart or a bulk apply that is
        # thousands. They queue here for a few database connections instead of all waiting in
        # the pool (and timing out there) at the same time.
        self._database_slots = asyncio.Semaphore(database_concurrency)

    async def created(
        self,
        *,
        namespace: str,
        name: str,
        uid: str,
        generation: int,
        spec: Mapping[str, Any],
        annotations: Mapping[str, str] | None = None,
    ) -> str:
        """Mirror a Notification (idempotent); return the outcome (a metrics label). Traced, the
        mirror is the span that starts the notification's trace (its row stores it)."""
        with tracing.span(
            "notify_queue.mirror",
            root=True,
            attributes={"k8s.namespace.name": namespace, "notify_queue.resource.name": name},
        ) as span:
            outcome = await self._created(
                namespace=namespace, name=name, uid=uid, generation=generation, spec=spec
            )
            # Annotated before (or while) it was first mirrored: kopf then never reports the
            # annotation as a change, so it is acted on here.
            by = rules.acknowledged_by(annotations or {})
            if by is not None and outcome in ("accepted", "existing"):
                await self.acknowledged(namespace=namespace, name=name, uid=uid, by=by)
            if span is not None:
                span.set_attribute(tracing.OUTCOME, outcome)
            return outcome

    async def _created(
        self, *, namespace: str, name: str, uid: str, generation: int, spec: Mapping[str, Any]
    ) -> str:
        involved = rules.object_reference(
            kind="Notification", namespace=namespace, name=name, uid=uid
        )
        try:
            new = rules.prepared_from_spec(
                namespace=namespace,
                uid=uid,
                spec=spec,
                now=datetime.now(UTC),
                default_region=self._default_region,
            )
        except ValidationFailed as exc:
            await self._reject(involved, generation, "Invalid", f"not accepted by the queue: {exc}")
            return "rejected"
        if new.request.escalation is not None:
            return await self._created_escalation(involved, generation, new)
        async with self._database_slots:
            # No look-up first: kopf calls this for objects it has not handled, which are nearly
            # always new, and enqueueing an existing key only finds the existing row.
            (result,) = await self._notifications.create_many([new])
            clash = False
            if not isinstance(result, ValidationFailed):
                stored = result.notification
                clash = result.conflict or stored.source is not Source.KUBERNETES
                if not clash:
                    await self._links.kube_link_save(
                        uid=uid,
                        namespace=namespace,
                        name=name,
                        notification_id=stored.id,
                        generation=generation,
                    )
        if isinstance(result, ValidationFailed):  # an unknown template, a missing variable
            await self._reject(
                involved, generation, "Invalid", f"not accepted by the queue: {result}"
            )
            return "rejected"
        if clash:
            await self._reject_key_conflict(involved, generation, new, stored)
            return "conflict"
        outcome = "accepted" if result.created else "existing"
        metrics.MIRRORS.labels("notification", outcome).inc()
        if result.created:
            await self._warn_if_policy_missing(involved, spec)
            self._kube.event_soon(
                involved=involved,
                type="Normal",
                reason="Accepted",
                message="enqueued as notification"
                + ("s " if len(result.notifications) > 1 else " ")
                + ", ".join(str(n.id) for n in (result.notifications or (stored,))),
            )
        return outcome

    async def _warn_if_policy_missing(
        self, involved: dict[str, str], spec: Mapping[str, Any]
    ) -> None:
        """A Warning Event when spec.policy names a NotificationPolicy that does not exist: the
        notification goes out under the workers' defaults (and the policy's, once it exists).
        Its Accepted condition says the same (services.kube_status)."""
        named = spec.get("policy")
        if not named or named == rules.DEFAULT_POLICY:
            return  # no policy, or the `default` one, which applies only when it exists
        try:
            found = await self._kube.custom_object_get(
                plural=rules.POLICIES, namespace=involved["namespace"], name=str(named)
            )
        except (KubeUnavailable, KubeRefused) as exc:
            log.warning("could not look up NotificationPolicy %r: %s", named, exc)
            return
        if found is None:
            self._kube.event_soon(
                involved=involved,
                type="Warning",
                reason="PolicyNotFound",
                message=f"NotificationPolicy {named!r} does not exist in namespace "
                f"{involved['namespace']}: the workers' defaults apply until it does",
            )

    async def _created_escalation(
        self, involved: dict[str, str], generation: int, new: PreparedRequest
    ) -> str:
        """Create the escalation (or find the one this object made before) and link the object
        to its last step."""
        if self._escalations is None:
            await self._reject(
                involved, generation, "Invalid", "spec.escalation: not served by this operator"
            )
            return "rejected"
        async with self._database_slots:
            try:
                result = await self._escalations.create(new)
            except ValidationFailed as exc:  # unknown recipient, a step without a contact
                await self._reject(
                    involved, generation, "Invalid", f"not accepted by the queue: {exc}"
                )
                return "rejected"
            steps = result.escalation.notifications
            clash = result.conflict or any(n.source is not Source.KUBERNETES for n in steps)
            if not clash:
                await self._links.kube_link_save(
                    uid=involved["uid"],
                    namespace=involved["namespace"],
                    name=involved["name"],
                    notification_id=steps[-1].id,
                    generation=generation,
                )
        if clash:
            await self._reject_key_conflict(involved, generation, new, steps[0])
            return "conflict"
        outcome = "accepted" if result.created else "existing"
        metrics.MIRRORS.labels("notification", outcome).inc()
        if result.created:
            self._kube.event_soon(
                involved=involved,
                type="Normal",
                reason="Accepted",
                message=f"enqueued as escalation {result.escalation.id} with "
                f"{len(steps)} step(s): " + ", ".join(str(n.id) for n in steps),
            )
        return outcome

    async def acknowledged(self, *, namespace: str, name: str, uid: str, by: str) -> str:
        """The object was annotated `notifyqueue.io/acknowledged=true`: acknowledge its
        escalation (again: harmless). Returns what happened (a log word)."""
        involved = rules.object_reference(
            kind="Notification", namespace=namespace, name=name, uid=uid
        )
        async with self._database_slots:
            link = await self._links.kube_link_get(uid=uid)
            if link is None:
                # Not mirrored (Rejected) or not yet (its create handler runs first and then
                # acknowledges, see `created`): nothing to acknowledge here.
                return "unlinked"
            try:
                row = await self._notifications.get(link.notification_id)
            except NotFound:
                return "unlinked"
            if row.escalation_id is None or self._escalations is None:
                self._kube.event_soon(
                    involved=involved,
                    type="Warning",
                    reason="NothingToAcknowledge",
                    message=f"annotation {rules.ACKNOWLEDGED}=true ignored: the Notification "
                    "has no spec.escalation",
                )
                return "no_escalation"
            before = await self._escalations.get(row.escalation_id)
            escalation = await self._escalations.acknowledge(row.escalation_id, by=by)
        if before.acknowledged_at is None:
            cancelled = sum(1 for n in escalation.notifications if n.last_error == "acknowledged")
            log.info(
                "escalation %s of Notification %s/%s acknowledged by %s",
                escalation.id,
                namespace,
                name,
                escalation.acknowledged_by,
            )
            self._kube.event_soon(
                involved=involved,
                type="Normal",
                reason="Acknowledged",
                message=f"escalation {escalation.id} acknowledged by {escalation.acknowledged_by}"
                f"; {cancelled} step(s) not yet sent cancelled",
            )
            return "acknowledged"
        return "already"

    async def _related(self, id: uuid.UUID) -> tuple[Notification, ...]:
        row = await self._notifications.get(id)
        if row.escalation_id is not None and self._escalations is not None:
            return (await self._escalations.get(row.escalation_id)).notifications
        return await self._notifications.siblings(id)

    async def _reject_key_conflict(
        self, involved: dict[str, str], generation: int, new: PreparedRequest, stored: Notification
    ) -> None:
        """The object's key already names a different request (made by `stored`)."""
        await self._reject(
            involved,
            generation,
            "IdempotencyKeyConflict",
            f"idempotency key {new.idempotency_key!r} is already used by notification "
            f"{stored.id} (created through the {stored.source.value} source) for a different "
            "request; use another idempotencyKey",
        )

    async def _reject(
        self, involved: dict[str, str], generation: int, reason: str, message: str
    ) -> None:
        metrics.MIRRORS.labels(
            "notification", "rejected" if reason == "Invalid" else "conflict"
        ).inc()
        log.warning(
            "Notification %s/%s rejected: %s", involved["namespace"], involved["name"], message
        )
        status = rejected_status(
            reason=reason, message=message, generation=generation, now=datetime.now(UTC)
        )
        await self._kube.status_patch(
            plural=rules.NOTIFICATIONS,
            namespace=involved["namespace"],
            name=involved["name"],
            uid=involved["uid"],
            status=status,
        )
        self._kube.event_soon(involved=involved, type="Warning", reason="Rejected", message=message)

    async def deleted(self, *, uid: str) -> None:
        """The object is gone: cancel its notification if still PENDING, drop the link.

        Idempotent and quick in every case (no row, a final row, a shared row): it runs on the
        object's DELETED event and again whenever the status writer finds the object gone.
        """
        async with self._database_slots:
            await self._release(uid)

    async def release_deleted_while_away(self, *, namespace: str | None) -> int:
        """Clean up after the objects deleted while no operator ran (no DELETED event came):
        the links are read first, then the objects listed, so an object created in between is
        never taken for a deleted one. Returns how many were cleaned up."""
        linked = await self._links.kube_link_uids(namespace=namespace)
        present = await self._kube.custom_object_uids(
            plural=rules.NOTIFICATIONS, namespace=namespace
        )
        gone = linked - present
        for uid in gone:
            await self.deleted(uid=uid)
        if gone:
            log.info("cleaned up %d Notifications deleted while the operator was away", len(gone))
        return len(gone)

    async def _release(self, uid: str) -> None:
        link = await self._links.kube_link_get(uid=uid)
        if link is None:
            return
        if link.other_links == 0:
            try:
                # A recipientId object became one row per channel, an escalation one per step:
                # cancel each still PENDING.
                related = await self._related(link.notification_id)
            except NotFound:
                related = ()
            for n in related:
                try:
                    await self._notifications.cancel(n.id)
                    log.info(
                        "cancelled notification %s: its Notification %s/%s was deleted",
                        n.id,
                        link.namespace,
                        link.name,
                    )
                except (Conflict, NotFound):
                    pass  # already past PENDING (or gone): nothing to cancel
        await self._links.kube_link_delete(uid=uid)


class PolicyMirror:
    """NotificationPolicies into the policies table, with their webhook Secret's key.

    The operator may only get a Secret by name (no list or watch of Secrets, docs/security.md),
    so a rotation is found by reading again: every `secret_refresh_seconds` (`run`) each Secret
    a policy names is read, and a policy whose key's value changed (or appeared, or went) is
    mirrored again.
    """

    def __init__(
        self, policies: PolicyRepository, kube: KubeApi, *, secret_refresh_seconds: float = 60.0
    ) -> None:
        self._policies = policies
        self._kube = kube
        self._secret_refresh_seconds = secret_refresh_seconds
        # (namespace, policy) -> its Secret reference and a digest of the value last mirrored
        # (None: missing), kept as policies are mirrored (every policy is, at start: resume).
        # A digest, so no second copy of the key sits in memory.
        self._secret_reads: dict[tuple[str, str], tuple[rules.SecretRef, str | None]] = {}

    async def changed(
        self,
        *,
        namespace: str,
        name: str,
        generation: int,
        spec: Mapping[str, Any],
        conditions: Sequence[Mapping[str, Any]] = (),
        uid: str,
    ) -> bool:
        """Mirror a NotificationPolicy (and its webhook Secret), report Ready; True if Ready.

        A policy that is not Ready (its Secret or key is missing, its spec unusable) is mirrored
        all the same, marked not ready: workers hold the notifications that name it rather than
        send them under the defaults (fail closed), and those show Reconciling/PolicyNotReady.
        """
        secret_value: str | None = None
        problem: tuple[str, str] | None = None
        try:
            # Checked before any use: a name such as ../../kube-system/secrets/x is refused here
            # (and by the CRD), never sent to the API server (docs/security.md).
            ref = rules.secret_ref_from_spec(spec)
        except ValidationFailed as exc:
            ref, problem = None, ("Invalid", f"{exc}; its notifications wait until it is fixed")
        if ref is None:
            self._secret_reads.pop((namespace, name), None)
        else:
            secret_value = await self._kube.secret_value(
                namespace=namespace, name=ref.name, key=ref.key
            )
            self._secret_reads[(namespace, name)] = (ref, _digest(secret_value))
            if secret_value is None:
                problem = (
                    "SecretNotFound",
                    f"Secret {ref.name!r} with key {ref.key!r} not found in namespace "
                    f"{namespace}; its notifications wait until it exists",
                )
        policy = Policy(name=rules.policy_name(namespace, name))
        try:
            policy = rules.policy_from_spec(
                namespace=namespace, name=name, spec=spec, webhook_secret=secret_value
            )
        except ValidationFailed as exc:
            problem = problem or ("Invalid", f"{exc}; its notifications wait until it is fixed")
        ready = problem is None
        if await self._policies.policy_upsert(policy=policy, ready=ready):
            if ready:
                await self._policies.policy_release_held(name=policy.name)
            await self._policies.policy_refresh_statuses(namespace=namespace, name=policy.name)
        reason, message = problem or (
            "Mirrored",
            f"mirrored as policy {rules.policy_name(namespace, name)}",
        )
        metrics.MIRRORS.labels("policy", "ready" if ready else "not_ready").inc()
        status = policy_status(
            ready=ready,
            reason=reason,
            message=message,
            generation=generation,
            now=datetime.now(UTC),
            previous=conditions,
        )
        await self._kube.status_patch(
            plural=rules.POLICIES, namespace=namespace, name=name, uid=uid, status=status
        )
        return ready

    async def run(self, stop: asyncio.Event) -> None:
        """Re-read the policies' Secrets every `secret_refresh_seconds`, until `stop`."""
        while not stop.is_set():
            await pause(stop, self._secret_refresh_seconds)
            if not stop.is_set():
                await self.refresh_secrets()

    async def refresh_secrets(self) -> list[str]:
        """Read each Secret a policy names (once per Secret and key) and mirror again each policy
        whose key's value is not the one it mirrored; returns those policies
        (`namespace/name`). A failure is logged and leaves that policy to the next round."""
        values: dict[tuple[str, rules.SecretRef], str | None] = {}
        mirrored = []
        for (namespace, name), (ref, seen) in list(self._secret_reads.items()):
            try:
                if (namespace, ref) not in values:
                    values[(namespace, ref)] = await self._kube.secret_value(
                        namespace=namespace, name=ref.name, key=ref.key
                    )
                if _digest(values[(namespace, ref)]) == seen:
                    continue
                await self.resync(namespace=namespace, name=name)
                mirrored.append(rules.policy_name(namespace, name))
            except (DatabaseUnavailable, KubeUnavailable, KubeRefused) as exc:
                log.warning(
                    "policy %s/%s: its Secret %r not re-read: %s", namespace, name, ref.name, exc
                )
        if mirrored:
            log.info("mirrored again after their Secret changed: %s", ", ".join(mirrored))
        return mirrored

    async def resync(self, *, namespace: str, name: str) -> None:
        """Mirror a policy again from what the API server has now (its Secret changed)."""
        body = await self._kube.custom_object_get(
            plural=rules.POLICIES, namespace=namespace, name=name
        )
        if body is None or body["metadata"].get("deletionTimestamp"):
            self._secret_reads.pop((namespace, name), None)
            return
        await self.changed(
            namespace=namespace,
            name=name,
            uid=body["metadata"]["uid"],
            generation=int(body["metadata"].get("generation", 1)),
            spec=body.get("spec") or {},
            conditions=(body.get("status") or {}).get("conditions") or (),
        )

    async def deleted(self, *, namespace: str, name: str) -> None:
        self._secret_reads.pop((namespace, name), None)
        await self._policies.policy_delete(name=rules.policy_name(namespace, name))


def _digest(value: str | None) -> str | None:
    return None if value is None else hashlib.sha256(value.encode()).hexdigest()


class TemplateMirror:
    """NotificationTemplates into the templates table as `namespace.name`, with Ready."""

    def __init__(self, recipients: RecipientService, kube: KubeApi) -> None:
        self._recipients = recipients
        self._kube = kube

    async def changed(
        self,
        *,
        namespace: str,
        name: str,
        uid: str,
        generation: int,
        spec: Mapping[str, Any],
        conditions: Sequence[Mapping[str, Any]] = (),
    ) -> bool:
        queue_name = rules.template_name(namespace, name)
        version: int | None = None
        try:
            template, _ = await self._recipients.template_put(
                queue_name, dict(spec), source=Source.KUBERNETES, prefix="spec."
            )
            version = template.version
            reason, message = "Mirrored", f"mirrored as template {queue_name} version {version}"
        except ValidationFailed as exc:
            reason, message = "Invalid", str(exc)
        metrics.MIRRORS.labels("template", "ready" if version else "not_ready").inc()
        status = template_status(
            ready=version is not None,
            reason=reason,
            message=message,
            generation=generation,
            now=datetime.now(UTC),
            version=version,
            name=queue_name,
            previous=conditions,
        )
        await self._kube.status_patch(
            plural=rules.TEMPLATES, namespace=namespace, name=name, uid=uid, status=status
        )
        return version is not None

    async def deleted(self, *, namespace: str, name: str) -> None:
        try:
            await self._recipients.template_delete(rules.template_name(namespace, name))
        except (NotFound, ValidationFailed):
            pass  # never mirrored (invalid name) or already gone
