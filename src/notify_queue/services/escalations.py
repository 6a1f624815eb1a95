"""Escalation until acknowledged (docs/escalation.md).

A create with `recipientId` and `escalation.steps` becomes an escalation and one notification
per step, each to the recipient's contact for the step's channel, due `afterSeconds` after the
creation; later steps wait with reason EscalationStep. The first step keeps the request's key,
step N (from 2) gets "<key> step<N>", so the request's key is taken as a plain create's would be
(a plain or recipientId create under it answers 409, as an escalation under theirs does).
Acknowledging marks the escalation and cancels every step not yet sent; the claim cancels any
step that comes back later (a failed attempt's retry), so an acknowledgement is never lost.
An `incident` step sent through a provider with `resolveOnAcknowledge` gets a resolve: one more
notification, queued like any other (so retried, and sent once: its key is "<key> resolve<N>"),
pinned to that provider, which resolves the step's incident (docs/providers.md).
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime

from notify_queue.errors import FieldError, NotFound, ValidationFailed
from notify_queue.limits import MAX_ESCALATION_STEPS
from notify_queue.models import (
    RESOLVE_PROVIDER_METADATA,
    RESOLVES_METADATA,
    Channel,
    Escalation,
    EscalationCreated,
    EscalationState,
    NewNotification,
    Notification,
    Status,
    TemplateRef,
    time_ordered_uuid,
)
from notify_queue.repositories.escalations import EscalationRepository
from notify_queue.services.preferences import derived_key
from notify_queue.services.rendering import InlineRenderer, Renderer
from notify_queue.services.templates import render
from notify_queue.services.validation import PreparedRequest, request_hash, same_request
from notify_queue.services.wakeups import DebouncedWaker

MAX_BY_CHARS = 255


def step_key(request_key: str, step: int) -> str:
    """The idempotency key of step `step` (0-based): the request's own for the first."""
    return request_key if step == 0 else f"{request_key} step{step + 1}"


def step_keys(request_key: str) -> list[str]:
    return [step_key(request_key, i) for i in range(MAX_ESCALATION_STEPS)]


class EscalationService:
    def __init__(
        self,
        repository: EscalationRepository,
        *,
        default_max_attempts: int,
        waker: DebouncedWaker | None = None,
        renderer: Renderer | None = None,
    ) -> None:
        self._repository = repository
        self._default_max_attempts = default_max_attempts
        self._waker = waker
        self._renderer: Renderer = renderer if renderer is not None else InlineRenderer()

    async def create(self, p: PreparedRequest) -> EscalationCreated:
        """Create the escalation, or answer what the key made before (created False; conflict
        when the key came with another request). ValidationFailed: unknown recipient, a step's
        channel without a contact, a template without a step's channel or a variable."""
        r = p.request
        assert r.escalation is not None and r.recipient_id is not None
        key = p.idempotency_key
        # Every key a request under `key` may have made: its steps', a recipientId request's.
        lookups = [*step_keys(key), derived_key(key, None)]
        lookups += [derived_key(key, c) for c in Channel]
        async with self._repository.create_transaction(request_key=key) as tx:
            existing = await tx.targeted.notifications_get_by_keys(idempotency_keys=lookups)
            if existing:
                return await self._answer_existing(p, existing)
            recipients = await tx.targeted.recipients_get(ids=[r.recipient_id])
            recipient = recipients.get(r.recipient_id)
            prefix = p.field_prefix
            if recipient is None:
                raise ValidationFailed(
                    [FieldError(prefix + "recipientId", f"no recipient with id {r.recipient_id}")]
                )
            template = None
            if r.template is not None:
                templates = await tx.targeted.templates_get(names=[r.template])
                template = templates.get(r.template)
                if template is None:
                    raise ValidationFailed(
                        [FieldError(prefix + "template", f"no template named {r.template}")]
                    )
            afters = r.escalation.after_seconds()
            errors = []
            steps: list[tuple[NewNotification, int]] = []
            for index, (step, after) in enumerate(zip(r.escalation.steps, afters, strict=True)):
                field = f"{prefix}escalation.steps.{index}.channel"
                contact = recipient.contact(step.channel)
                if contact is None:
                    errors.append(
                        FieldError(field, f"recipient {recipient.id} has no {step.channel} contact")
                    )
                    continue
                if template is not None and step.channel.value not in template.channels:
                    errors.append(FieldError(field, f"template has no {step.channel} entry"))
                    continue
                if template is not None:
                    subject, body = await render(
                        self._renderer,
                        template.channels,
                        step.channel,
                        r.data or {},
                        field_prefix=prefix,
                    )
                else:
                    assert r.body is not None
                    subject, body = r.subject, r.body
                n = p.notification(
                    channel=step.channel,
                    recipient=contact,
                    subject=subject,
                    body=body,
                    idempotency_key=step_key(key, index),
                    template=TemplateRef(template.name, template.version) if template else None,
                )
                detail = (
                    f"escalation step {index + 1} of {len(afters)} ({step.channel}): sent "
                    f"{after} s after the creation unless acknowledged first"
                )
                steps.append((replace(n, escalation_detail=detail), after))
            if errors:
                raise ValidationFailed(errors)
            escalation_id = time_ordered_uuid()
            rows = await tx.escalation_insert(
                id=escalation_id,
                recipient_id=recipient.id,
                idempotency_key=key,
                steps=steps,
                default_max_attempts=self._default_max_attempts,
            )
            if len(rows) != len(steps):
                # A step's key was taken between the look-up and the insert (a plain create
                # naming "<key> stepN"): nothing of this escalation may stay.
                raise _KeyTaken()
        if self._waker is not None:
            await self._waker.poke()
        order = {n.id: i for i, (n, _) in enumerate(steps)}
        made = tuple(sorted(rows, key=lambda n: order[n.id]))
        return EscalationCreated(
            Escalation(
                id=escalation_id,
                state=EscalationState.ACTIVE,
                recipient_id=recipient.id,
                acknowledged_at=None,
                acknowledged_by=None,
                created_at=made[0].created_at,
                notifications=made,
            ),
            created=True,
        )

    async def _answer_existing(
        self, p: PreparedRequest, existing: dict[str, tuple[Notification, str]]
    ) -> EscalationCreated:
        first, stored_hash = existing.get(p.idempotency_key, next(iter(existing.values())))
        escalation_id = first.escalation_id
        found = None if escalation_id is None else await self.get(escalation_id)
        conflict = (
            found is None
            or any(not same_request(h, p.request_hash) for _, h in existing.values())
            or not same_request(stored_hash, p.request_hash)
        )
        if found is None:
            # The key belongs to a notification that is no escalation's: a clash (409).
            found = Escalation(
                id=uuid.UUID(int=0),
                state=EscalationState.ACTIVE,
                recipient_id="",
                acknowledged_at=None,
                acknowledged_by=None,
                created_at=first.created_at,
                notifications=(first,),
            )
        return EscalationCreated(found, created=False, conflict=conflict)

    async def get(self, id: uuid.UUID) -> Escalation:
        found = await self._repository.escalation_get(id=id)
        if found is None:
            raise NotFound(f"escalation {id} does not exist")
        return found

    async def acknowledge(self, id: uuid.UUID, *, by: str | None = None) -> Escalation:
        """Acknowledge: 200 with the escalation, acknowledged; again: the same, unchanged."""
        if by is not None and not 1 <= len(by) <= MAX_BY_CHARS:
            raise ValidationFailed([FieldError("by", f"must be 1-{MAX_BY_CHARS} characters")])
        if not await self._repository.escalation_acknowledge(id=id, by=by):
            raise NotFound(f"escalation {id} does not exist")
        escalation = await self.get(id)
        await self._resolve_incidents(escalation, by)
        return escalation

    async def _resolve_incidents(self, escalation: Escalation, by: str | None) -> None:
        """Queue a resolve for each incident step sent through a resolving provider. Again on a
        repeated acknowledgement: the keys make a resolve once, and a step that was in flight at
        the first is resolved by the next."""
        sent = [
            (index, n)
            for index, n in enumerate(escalation.notifications)
            if n.channel is Channel.INCIDENT and n.status is Status.SENT and n.provider
        ]
        if not sent:
            return
        resolvers = await self._repository.provider_resolvers_read()
        key = escalation.notifications[0].idempotency_key
        now = datetime.now(UTC)
        resolves = [
            NewNotification(
                idempotency_key=f"{key} resolve{index + 1}",
                request_hash=request_hash({"resolves": str(n.id)}),
                channel=Channel.INCIDENT,
                recipient=n.recipient,
                subject=f"Resolved: {n.subject}" if n.subject else "Resolved",
                body=f"acknowledged by {by}" if by else "acknowledged",
                priority=n.priority,
                send_at=now,
                metadata={RESOLVES_METADATA: str(n.id), RESOLVE_PROVIDER_METADATA: n.provider},
                category=n.category,
            )
            for index, n in sent
            if n.provider in resolvers
        ]
        if not resolves:
            return
        async with self._repository.create_transaction(request_key=key) as tx:
            await tx.targeted.notifications_insert(
                notifications=resolves, default_max_attempts=self._default_max_attempts
            )
        if self._waker is not None:
            await self._waker.poke()


class _KeyTaken(ValidationFailed):
    def __init__(self) -> None:
        super().__init__(
            [FieldError("idempotencyKey", "a key of this escalation's steps was taken meanwhile")]
        )
