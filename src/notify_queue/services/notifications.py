"""The notification rules the API and the operator share: enqueue (idempotent), read, list,
cancel, retry, and the queue's status.

Idempotency is decided by the database (a unique key), so it holds across API processes: the
service inserts, and for every key that already existed compares the stored request hash with
this one: the same request is answered with the original (200), a different one is a conflict
(409).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import uuid
from collections.abc import Sequence
from dataclasses import replace as _replace
from datetime import datetime

from notify_queue.errors import Conflict, FieldError, NotFound, ValidationFailed
from notify_queue.models import (
    DEFAULT_CHANNELS,
    RETRYABLE_STATUSES,
    Channel,
    CreateResult,
    NewNotification,
    Notification,
    QueueStatus,
    Recipient,
    Status,
    Template,
    TemplateRef,
    WaitingReason,
)
from notify_queue.repositories.notifications import NotificationRepository
from notify_queue.services.coalescing import CreateCoalescer
from notify_queue.services.preferences import derived_key, opt_out_reason
from notify_queue.services.rendering import InlineRenderer, Renderer
from notify_queue.services.templates import render
from notify_queue.services.validation import PreparedRequest, same_request
from notify_queue.services.waiting import LiveLanes
from notify_queue.services.wakeups import DebouncedWaker

MAX_BATCH = 1000
MAX_PAGE = 1000
# Statements of coalesced single creates running at once (services.coalescing). One: every create
# that arrives while a statement runs goes into the next, so under load a statement carries as
# many creates as there are clients waiting. PostgreSQL's cost per statement is most of a small
# one's, so fewer statements in flight means fewer, fuller statements and less PostgreSQL CPU per
# create (docs/performance.md). A lone create still goes at once.
CREATES_IN_FLIGHT = 1


class NotificationService:
    def __init__(
        self,
        repository: NotificationRepository,
        *,
        default_max_attempts: int,
        waker: DebouncedWaker | None = None,
        creates_in_flight: int = CREATES_IN_FLIGHT,
        renderer: Renderer | None = None,
        lanes: LiveLanes | None = None,
    ) -> None:
        """`renderer` renders templates; a process serving clients passes a RenderPool (the
        inline default has no time or memory limit: for tests and tools)."""
        self._repository = repository
        self._renderer: Renderer = renderer if renderer is not None else InlineRenderer()
        self._default_max_attempts = default_max_attempts
        self._waker = waker
        # The lanes live workers serve, for `NoWorker` (services/waiting.py); read from the
        # repository's database unless given (a test's clock).
        self._lanes = lanes if lanes is not None else LiveLanes(repository.workers)
        self._creates = CreateCoalescer(
            self.create_many, max_in_flight=creates_in_flight, max_batch=MAX_BATCH
        )

    async def enqueue(self, notification: NewNotification) -> CreateResult:
        return (await self.enqueue_many([notification]))[0]

    async def create(self, request: PreparedRequest) -> CreateResult | ValidationFailed:
        """One create, as `create_many([request])[0]`; creates arriving while others are being
        written share the next statement (services.coalescing)."""
        return await self._creates.create(request)

    async def create_many(
        self, requests: Sequence[PreparedRequest]
    ) -> list[CreateResult | ValidationFailed]:
        """Enqueue validated requests of every kind, one result (or 400) per request, in order.

        Plain requests go straight in; those with a template are rendered first; those with a
        recipientId are expanded over the recipient's channels in one transaction.
        """
        if len(requests) > MAX_BATCH:
            raise ValidationFailed([FieldError("notifications", f"at most {MAX_BATCH} items")])
        results: list[CreateResult | ValidationFailed | None] = [None] * len(requests)
        names = sorted(
            {
                p.request.template
                for p in requests
                if p.request.recipient_id is None and p.request.template is not None
            }
        )
        templates = await self._repository.templates_get(names=names) if names else {}
        direct: list[tuple[int, NewNotification]] = []
        targeted: list[int] = []
        templated: list[int] = []
        for index, p in enumerate(requests):
            if p.request.escalation is not None:
                # An escalation is one request of its own (services.escalations), never part
                # of a batch's statement.
                results[index] = ValidationFailed(
                    [
                        FieldError(
                            p.field_prefix + "escalation",
                            "not in a batch: create an escalation with POST /notifications",
                        )
                    ]
                )
            elif p.request.recipient_id is not None:
                targeted.append(index)
            elif p.request.template is not None:
                templated.append(index)
            else:
                direct.append((index, _plain(p)))
        if templated:
            # Rendered concurrently: the renderer's workers share them out, and a template that
            # runs to the time limit holds up only the requests that wait for its worker.
            made = await asyncio.gather(
                *(_addressed(self._renderer, requests[i], templates) for i in templated),
                return_exceptions=True,
            )
            for index, rendered in zip(templated, made, strict=True):
                if isinstance(rendered, ValidationFailed):
                    results[index] = rendered
                elif isinstance(rendered, BaseException):
                    raise rendered
                else:
                    direct.append((index, rendered))
            direct.sort(key=lambda item: item[0])  # request order: the first of a key wins
        if direct:
            enqueued = await self.enqueue_many([n for _, n in direct])
            for (index, _), result in zip(direct, enqueued, strict=True):
                results[index] = result
        if targeted:
            expanded = await self._enqueue_targeted([requests[i] for i in targeted])
            for index, outcome in zip(targeted, expanded, strict=True):
                results[index] = outcome
        done = [r for r in results if r is not None]
        # The answer says what a read would: a due notification no live worker serves waits
        # NoWorker (the lanes are read at most once per few seconds per process).
        await self._lanes.apply(
            [
                n
                for r in done
                if isinstance(r, CreateResult)
                for n in (r.notification, *r.notifications)
            ]
        )
        return done

    async def _enqueue_targeted(
        self, requests: Sequence[PreparedRequest]
    ) -> list[CreateResult | ValidationFailed]:
        """Expand user-targeted requests in one transaction, serialised per request key.

        A request seen before (any of its derived keys exists) is answered with what it became
        then, whatever the preferences are now: 200 with the same notifications, or 409 when the
        key came with another request. Otherwise it becomes one notification per chosen channel,
        or one SUPPRESSED notification when every channel is opted out (or has no contact).
        """
        keys = [p.idempotency_key for p in requests]
        lookups = [k for k in keys] + [derived_key(k, c) for k in keys for c in [*Channel, None]]
        outcomes: list[CreateResult | ValidationFailed | None] = [None] * len(requests)
        async with self._repository.targeted_transaction(request_keys=keys) as tx:
            existing = await tx.notifications_get_by_keys(idempotency_keys=lookups)
            fresh = [
                i
                for i, p in enumerate(requests)
                # The request's own key too: an address-targeted create or an escalation took
                # it (409 below), else this would make a second set under one key.
                if not any(k in existing for k in [p.idempotency_key, *_keys_of(p.idempotency_key)])
            ]
            recipients = await tx.recipients_get(
                ids=sorted({str(requests[i].request.recipient_id) for i in fresh})
            )
            names = sorted(
                {str(requests[i].request.template) for i in fresh if requests[i].request.template}
            )
            templates = await tx.templates_get(names=names) if names else {}
            planned: dict[str, tuple[str, list[NewNotification]]] = {}
            to_insert: list[NewNotification] = []
            first_of_key: dict[str, int] = {}
            for index in fresh:  # the others are answered from the stored (or planned) rows
                first_of_key.setdefault(requests[index].idempotency_key, index)
            expansions = await asyncio.gather(
                *(
                    _expand(
                        self._renderer,
                        requests[i],
                        recipients.get(str(requests[i].request.recipient_id)),
                        templates,
                    )
                    for i in first_of_key.values()
                ),
                return_exceptions=True,
            )
            for index, expansion in zip(first_of_key.values(), expansions, strict=True):
                p = requests[index]
                if isinstance(expansion, ValidationFailed):
                    outcomes[index] = expansion
                    continue
                if isinstance(expansion, BaseException):
                    raise expansion
                planned[p.idempotency_key] = (p.request_hash, expansion)
                to_insert.extend(expansion)
            inserted = {
                n.id: n
                for n in await tx.notifications_insert(
                    notifications=to_insert, default_max_attempts=self._default_max_attempts
                )
            }
        if any(n.status is Status.PENDING for n in inserted.values()) and self._waker is not None:
            await self._waker.poke()
        answered: set[str] = set()
        for index, p in enumerate(requests):
            if outcomes[index] is not None:
                continue
            key = p.idempotency_key
            if key in planned:
                stored_hash, rows = planned[key]
                made = tuple(inserted[n.id] for n in rows if n.id in inserted)
                first_time = key not in answered
                answered.add(key)
                outcomes[index] = CreateResult(
                    made[0],
                    created=first_time,
                    conflict=not first_time and not same_request(stored_hash, p.request_hash),
                    notifications=made,
                )
                continue
            if key in existing:  # the key of an address-targeted notification
                stored, _ = existing[key]
                outcomes[index] = CreateResult(stored, created=False, conflict=True)
                continue
            found = [existing[k] for k in _keys_of(key) if k in existing]
            notifications = tuple(n for n, _ in found)
            outcomes[index] = CreateResult(
                notifications[0],
                created=False,
                conflict=any(not same_request(h, p.request_hash) for _, h in found),
                notifications=notifications,
            )
        return [o for o in outcomes if o is not None]

    async def enqueue_many(self, notifications: Sequence[NewNotification]) -> list[CreateResult]:
        """Enqueue a batch in two statements at most; one result per item, in order."""
        if len(notifications) > MAX_BATCH:
            raise ValidationFailed([FieldError("notifications", f"at most {MAX_BATCH} items")])
        # The wake-up goes with the insert when the waker says one is due now (its statement
        # sends it at commit, if it inserted a row); otherwise, or if it sent none, it is owed.
        wake = self._waker.take() if self._waker is not None else False
        try:
            inserted = {
                n.idempotency_key: n
                for n in await self._repository.notifications_insert(
                    notifications=notifications,
                    default_max_attempts=self._default_max_attempts,
                    wake=wake,
                )
            }
        except BaseException:
            if wake and self._waker is not None:
                self._waker.owe()  # hand back what this statement took and did not send
            raise
        if self._waker is not None and (wake != bool(inserted)):
            # Rows inserted without the wake-up, or a wake-up taken and not sent (no row).
            self._waker.owe()
        missing = [n.idempotency_key for n in notifications if n.idempotency_key not in inserted]
        existing = (
            await self._repository.notifications_get_by_keys(idempotency_keys=missing)
            if missing
            else {}
        )
        results: list[CreateResult] = []
        first_of_key: set[str] = set()
        for n in notifications:
            key = n.idempotency_key
            if key in inserted and key not in first_of_key and inserted[key].id == n.id:
                first_of_key.add(key)
                results.append(CreateResult(inserted[key], created=True))
                continue
            stored, stored_hash = (
                (inserted[key], _hash_of_inserted(notifications, inserted[key]))
                if key in inserted
                else existing[key]
            )
            results.append(
                CreateResult(
                    stored, created=False, conflict=not same_request(stored_hash, n.request_hash)
                )
            )
        return results

    async def get(self, id: uuid.UUID) -> Notification:
        found = await self._repository.notification_get(id=id)
        if found is None:
            raise NotFound(f"notification {id} does not exist")
        await self._lanes.apply([found])
        return found

    async def list(
        self,
        *,
        status: Status | None = None,
        channel: str | None = None,
        recipient: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
        recipient_id: str | None = None,
        waiting: WaitingReason | None = None,
    ) -> tuple[list[Notification], str | None]:
        """A page oldest first, and the cursor of the next page (None: this is the last)."""
        if not 1 <= limit <= MAX_PAGE:
            raise ValidationFailed([FieldError("limit", f"must be between 1 and {MAX_PAGE}")])
        after = decode_cursor(cursor) if cursor else None
        items = await self._repository.notifications_list(
            status=status,
            channel=channel,
            recipient=recipient,
            recipient_id=recipient_id,
            after=after,
            limit=limit + 1,
            waiting=waiting,
            unserved=await self._lanes.unserved()
            if waiting is WaitingReason.NO_WORKER
            else frozenset(),
        )
        await self._lanes.apply(items)
        if len(items) <= limit:
            return items, None
        items = items[:limit]
        return items, encode_cursor(items[-1].created_at, items[-1].id)

    async def siblings(self, id: uuid.UUID) -> tuple[Notification, ...]:
        """Every notification the request of `id` became: itself, or for a recipientId request
        all of its channels (their keys are derived from the request's key)."""
        found = await self.get(id)
        if found.recipient_id is None:
            return (found,)
        request_key = found.idempotency_key.rsplit(" ", 1)[0]
        rows = await self._repository.notifications_get_by_keys(
            idempotency_keys=_keys_of(request_key)
        )
        return tuple(n for n, _ in rows.values()) or (found,)

    async def cancel(self, id: uuid.UUID) -> Notification:
        cancelled = await self._repository.notification_cancel(id=id)
        if cancelled is not None:
            return cancelled
        current = await self.get(id)
        raise Conflict(f"notification {id} is {current.status}; only PENDING can be cancelled")

    async def retry(self, id: uuid.UUID) -> Notification:
        retried = await self._repository.notification_retry(id=id)
        if retried is None:
            current = await self.get(id)
            if current.status in RETRYABLE_STATUSES:
                # Retention forgot its key: its partition is being dropped (0011).
                raise Conflict(
                    f"notification {id} is past the retention and being removed; it cannot be "
                    f"retried"
                )
            raise Conflict(
                f"notification {id} is {current.status}; only FAILED or DEAD_LETTERED can be "
                f"retried"
            )
        if self._waker is not None:
            await self._waker.poke()
        return retried

    async def retry_batch(self, *, status: Status, limit: int = MAX_BATCH) -> tuple[int, int]:
        """Retry up to `limit` (≤ 1,000) oldest first; return (retried, remaining)."""
        if status not in RETRYABLE_STATUSES:
            raise ValidationFailed([FieldError("status", "must be DEAD_LETTERED or FAILED")])
        if not 1 <= limit <= MAX_BATCH:
            raise ValidationFailed([FieldError("limit", f"must be between 1 and {MAX_BATCH}")])
        retried, remaining = await self._repository.notifications_retry_batch(
            status=status, limit=limit
        )
        if retried and self._waker is not None:
            await self._waker.poke()
        return retried, remaining

    async def status(self, *, waiting: bool = False) -> QueueStatus:
        """The queue now; with `waiting`, also the count per waiting reason (for /metrics)."""
        unserved = await self._lanes.unserved() if waiting else frozenset()
        return await self._repository.queue_status(waiting=waiting, unserved=unserved)


def _keys_of(request_key: str) -> list[str]:
    """The derived keys a user-targeted request's notifications can have, in channel order."""
    return [derived_key(request_key, c) for c in [*Channel, None]]


def _plain(p: PreparedRequest) -> NewNotification:
    """An address-targeted request without a template as its notification."""
    r = p.request
    assert r.channel is not None and r.recipient is not None and r.body is not None
    return p.notification(channel=r.channel, recipient=r.recipient, subject=r.subject, body=r.body)


async def _addressed(
    renderer: Renderer, p: PreparedRequest, templates: dict[str, Template]
) -> NewNotification:
    """An address-targeted request naming a template, rendered as its notification."""
    r = p.request
    assert r.channel is not None and r.recipient is not None
    template = _template(p, templates)
    if r.channel.value not in template.channels:
        raise ValidationFailed(
            [FieldError(p.field_prefix + "template", f"has no {r.channel.value} entry")]
        )
    subject, body = await render(
        renderer, template.channels, r.channel, r.data or {}, field_prefix=p.field_prefix
    )
    return p.notification(
        channel=r.channel,
        recipient=r.recipient,
        subject=subject,
        body=body,
        template=TemplateRef(template.name, template.version),
    )


async def _expand(
    renderer: Renderer,
    p: PreparedRequest,
    recipient: Recipient | None,
    templates: dict[str, Template],
) -> list[NewNotification]:
    """The notifications a user-targeted request becomes (rules: docs/recipients.md)."""
    r = p.request
    if recipient is None:
        raise ValidationFailed(
            [FieldError(p.field_prefix + "recipientId", f"no recipient with id {r.recipient_id}")]
        )
    order = list(r.channels or DEFAULT_CHANNELS)
    template = _template(p, templates) if r.template is not None else None
    if template is not None and not any(c.value in template.channels for c in order):
        raise ValidationFailed(
            [
                FieldError(
                    p.field_prefix + "template",
                    f"has none of the channels {', '.join(c.value for c in order)}",
                )
            ]
        )
    ref = TemplateRef(template.name, template.version) if template else None
    # Channels the recipient has a contact for (and the template an entry for), in order.
    usable = [
        c
        for c in order
        if recipient.contact(c) and (template is None or c.value in template.channels)
    ]
    texts: dict[Channel, tuple[str | None, str]] = {}
    for c in usable:  # rendered even when opted out: a missing variable is always a 400
        if template is not None:
            texts[c] = await render(
                renderer, template.channels, c, r.data or {}, field_prefix=p.field_prefix
            )
        else:
            assert r.body is not None
            texts[c] = (r.subject, r.body)
    reasons = {c: opt_out_reason(recipient.preferences, c, p.category) for c in usable}
    chosen = [c for c in usable if reasons[c] is None]
    if r.strategy == "first":
        chosen = chosen[:1]
    if chosen:
        return [
            p.notification(
                channel=c,
                recipient=str(recipient.contact(c)),
                subject=texts[c][0],
                body=texts[c][1],
                idempotency_key=derived_key(p.idempotency_key, c),
                template=ref,
            )
            for c in chosen
        ]
    why = [f"{c.value}: {reasons[c]}" for c in usable] + [
        f"{c.value}: no contact" if recipient.contact(c) is None else f"{c.value}: not in template"
        for c in order
        if c not in usable
    ]
    channel = usable[0] if usable else order[0]
    subject, body = texts.get(channel, (r.subject, r.body or ""))
    suppressed = p.notification(
        channel=channel,
        recipient=recipient.contact(channel) or recipient.id,
        subject=subject,
        body=body,
        idempotency_key=derived_key(p.idempotency_key, None),
        template=ref,
    )
    return [
        _replace(suppressed, status=Status.SUPPRESSED, last_error="suppressed: " + "; ".join(why))
    ]


def _template(p: PreparedRequest, templates: dict[str, Template]) -> Template:
    found = templates.get(str(p.request.template))
    if found is None:
        raise ValidationFailed(
            [FieldError(p.field_prefix + "template", f"no template named {p.request.template}")]
        )
    return found


def _hash_of_inserted(batch: Sequence[NewNotification], stored: Notification) -> str:
    """The request hash of the batch item that created `stored` (a key repeated within a batch)."""
    return next(n.request_hash for n in batch if n.id == stored.id)


def encode_cursor(created_at: datetime, id: uuid.UUID) -> str:
    raw = f"{created_at.isoformat()}|{id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created_at, _, id = raw.partition("|")
        moment = datetime.fromisoformat(created_at)
        if moment.tzinfo is None:
            raise ValueError("naive")
        return moment, uuid.UUID(id)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ValidationFailed(
            [FieldError("cursor", "is not a cursor this API returned")]
        ) from None
