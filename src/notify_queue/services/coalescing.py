"""Single creates that arrive together are enqueued together: one statement for all of them.

A lone `POST /notifications` used to be one INSERT and one commit of its own. PostgreSQL's cost of
a one-row statement (parse, plan, the trigger and function calls, the commit's WAL flush) is
many times its cost per row in a batch, so under concurrent load the database, not the API, set
the pace. Here a create is sent at once when fewer than `max_in_flight` statements are running
(a lone request waits for nothing), and otherwise waits for the next free slot, which takes every
create waiting by then (up to a batch's limit) into one `create_many` call: group commit, done by
the application.

Nothing a client sees changes. Each caller still gets its answer only after the statement that
holds its notification has committed; idempotency is the batch's (a key repeated within one
statement: the first is created, the rest answered 200 or 409 as if they had come one after the
other), which is also what two racing statements give. A statement that fails for another reason
than the database being away is retried one create at a time, so one create cannot fail others.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from notify_queue import tracing
from notify_queue.errors import DatabaseUnavailable, ValidationFailed
from notify_queue.models import CreateResult
from notify_queue.services.validation import PreparedRequest

log = logging.getLogger(__name__)

Outcome = CreateResult | ValidationFailed
CreateMany = Callable[[Sequence[PreparedRequest]], Awaitable[list[Outcome]]]


class CreateCoalescer:
    def __init__(self, create_many: CreateMany, *, max_in_flight: int, max_batch: int) -> None:
        self._create_many = create_many
        self._max_in_flight = max_in_flight
        self._max_batch = max_batch
        self._waiting: list[tuple[PreparedRequest, asyncio.Future[Outcome]]] = []
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def create(self, request: PreparedRequest) -> Outcome:
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._waiting.append((request, future))
        if self._in_flight < self._max_in_flight:
            self._send_waiting()
        return await future

    def _send_waiting(self) -> None:
        batch = self._waiting[: self._max_batch]
        del self._waiting[: self._max_batch]
        self._in_flight += 1
        task = asyncio.create_task(self._send(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[tuple[PreparedRequest, asyncio.Future[Outcome]]]) -> None:
        # Traced, the statement is a span of its own, linked to each create's request: it serves
        # many requests' traces, and this task would otherwise run in whichever request's
        # context started it. Each notification stores its own request's context (validation).
        links = [r.traceparent for r, _ in batch] if tracing.enabled() else ()
        try:
            with tracing.span(
                "notify_queue.create",
                root=True,
                links=links,
                attributes={tracing.BATCH_SIZE: len(batch)},
            ):
                await self._settle(batch)
        finally:
            self._in_flight -= 1
            if self._waiting:
                self._send_waiting()

    async def _settle(self, batch: list[tuple[PreparedRequest, asyncio.Future[Outcome]]]) -> None:
        try:
            outcomes = await self._create_many([request for request, _ in batch])
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except DatabaseUnavailable as exc:
            _fail(batch, exc)
            return
        except Exception as exc:
            if len(batch) == 1:
                _fail(batch, exc)
                return
            log.warning(
                "a coalesced create of %d failed (%s); retrying one by one", len(batch), exc
            )
            for one in batch:
                await self._settle([one])
            return
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            if not future.done():  # done: its caller was cancelled (the client went away)
                future.set_result(outcome)


def _fail(batch: list[tuple[PreparedRequest, asyncio.Future[Outcome]]], exc: Exception) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(exc)
