"""What a delivery attempt's result means for the notification: the retry rules.

Pure functions of the claimed notification and the provider's answer, so the rules can be tested
(and property-tested) without a database or a provider.

- SENT: final.
- Permanent failure: FAILED at once; retrying cannot help.
- Temporary failure: back to PENDING after a backoff, unless the attempts are used up: then
  DEAD_LETTERED, keeping its history (attempt count, last error). The final re-check after a crash
  on the last attempt (attempt max+1) also ends here when it fails.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime

from notify_queue.models import (
    Channel,
    ClaimedNotification,
    Completion,
    DeliveryResult,
    Outcome,
    Priority,
    Status,
    WaitingReason,
    Wakeup,
)
from notify_queue.repositories.delivery import (
    NO_CHAIN_HEADS,
    ChainHeads,
    ClaimedBatch,
    DeliveryRepository,
    Recorded,
)
from notify_queue.services.backoff import backoff_seconds, retry_after_seconds
from notify_queue.services.digests import DigestRenderFailed, render_digest
from notify_queue.services.preferences import (
    Clock,
    held_by_quiet_hours,
    screen_claimed,
    system_clock,
)
from notify_queue.services.rendering import Renderer
from notify_queue.services.unsubscribe import UnsubscribeLinks

log = logging.getLogger(__name__)

# Why a notification no provider was asked for waits (docs/design.md, "Why a notification waits").
_NOT_TRIED_REASONS = {
    Outcome.CIRCUIT_OPEN: WaitingReason.CIRCUIT_OPEN,
    Outcome.PROVIDER_LIMITED: WaitingReason.PROVIDER_RATE_LIMIT,
    Outcome.RATE_LIMITED: WaitingReason.RECIPIENT_RATE_LIMIT,
}


def decide_completion(
    claimed: ClaimedNotification, result: DeliveryResult, *, rng: random.Random | None = None
) -> Completion:
    error = result.error  # already made safe and capped (models.external_text)

    def completion(
        status: Status,
        retry_in_seconds: float | None,
        *,
        give_back_attempt: bool = False,
        waiting_reason: WaitingReason | None = None,
    ) -> Completion:
        return Completion(
            claimed.id,
            claimed.claim_token,
            status,
            retry_in_seconds,
            None if status is Status.SENT else error,
            result.provider_message_id if status is Status.SENT else None,
            provider=result.provider,
            attempts_json=result.attempts_json,
            give_back_attempt=give_back_attempt,
            address_gone=result.address_gone and status is Status.FAILED,
            bound_provider=result.bound_provider,
            waiting_reason=waiting_reason,
            waiting_detail=result.waiting_detail if waiting_reason is not None else None,
        )

    if result.outcome is Outcome.SENT:
        return completion(Status.SENT, None)
    if result.outcome is Outcome.PERMANENT_FAILURE:
        return completion(Status.FAILED, None)
    if not result.outcome.uses_attempt:
        # Every provider of the chain was open or rate-limited: nothing was tried. The
        # notification waits for the earliest probe or free slot and gets its attempt back,
        # exactly like the recipient's rate limit; the reason it waits names the provider(s).
        wait = result.retry_after_seconds if result.retry_after_seconds is not None else 1.0
        return completion(
            Status.PENDING,
            max(wait, 0.0),
            give_back_attempt=True,
            waiting_reason=_NOT_TRIED_REASONS[result.outcome],
        )
    if claimed.attempt_count >= claimed.max_attempts:
        return completion(Status.DEAD_LETTERED, None)
    if result.retry_after_seconds is not None:
        wait = retry_after_seconds(result.retry_after_seconds, maximum=claimed.backoff_max_seconds)
    else:
        wait = backoff_seconds(
            claimed.attempt_count,
            base=claimed.backoff_base_seconds,
            maximum=claimed.backoff_max_seconds,
            rng=rng,
        )
    return completion(Status.PENDING, wait)


class _NoTemplates:
    """The renderer of a service built without one: a digest's template cannot be rendered."""

    async def render(self, parts: object, data: object) -> dict[str, str]:
        raise DigestRenderFailed("this worker renders no templates")

    async def close(self) -> None:
        pass


_NO_TEMPLATES = _NoTemplates()


class DeliveryService:
    """The worker's use of the queue: claim a batch, record a batch of results, hand back claims,
    and the housekeeping every worker shares (lease recovery, expiry, pruning old slots)."""

    def __init__(
        self,
        repository: DeliveryRepository,
        *,
        priorities: Sequence[Priority],
        channels: Sequence[Channel],
        clock: Clock = system_clock,
        renderer: Renderer | None = None,
        unsubscribe: UnsubscribeLinks | None = None,
    ) -> None:
        self._repository = repository
        # One-click unsubscribe links for the emails that may have one (docs/receipts.md).
        self._unsubscribe = unsubscribe
        # Renders digests with a template (services/digests.py); None: only default renderings.
        self._renderer = renderer
        self._priorities = list(priorities)
        self._channels = list(channels)
        # Quiet hours are read against this clock: the test seam (a frozen moment in tests).
        self._clock = clock

    async def claim(self, limit: int, *, chain_heads: ChainHeads = NO_CHAIN_HEADS) -> ClaimedBatch:
        """Claim a batch; the send-time preference check runs inside the claim transaction.

        Of a user-targeted notification, the recipient's current preferences come with the claim
        row; an opt-out makes it SUPPRESSED and quiet hours defer it (or expire it), recorded in
        the same transaction without calling a provider and without using an attempt. Quiet
        hours are asked once more before admission, so a row they hold takes no place in its
        recipient's rate window. Only
        what may be sent now is returned in `claimed`. If the database is slow or away the claim
        fails as a whole: nothing is handed out, so nothing unchecked is ever sent.
        """
        now = self._clock()
        batch = await self._repository.notifications_claim(
            priorities=self._priorities,
            channels=self._channels,
            limit=limit,
            screen=lambda claimed, without_slot: screen_claimed(
                claimed, now, without_slot=without_slot
            ),
            quiet_hours=lambda c: held_by_quiet_hours(
                c.priority, c.category, c.timezone, c.quiet_start, c.quiet_end, now
            ),
            chain_heads=chain_heads,
        )
        claimed = batch.claimed
        if any(c.digest_id is not None for c in claimed):
            claimed = await self._with_digests(claimed)
        if self._unsubscribe is not None:
            for c in claimed:
                c.email_headers = self._unsubscribe.headers_for(
                    c.channel, c.recipient_id, c.category
                )
        # A digest's carriers are new objects (their rendering): the batch carries those.
        return batch if claimed is batch.claimed else dataclasses.replace(batch, claimed=claimed)

    async def _with_digests(
        self, claimed: Sequence[ClaimedNotification]
    ) -> list[ClaimedNotification]:
        """A digest's carrier carries the digest's one message (docs/digests.md); a digest that
        cannot be rendered ends FAILED here, with the reason, and is not handed out."""
        contents = await self._repository.digests_contents(
            digests=[
                (c.digest_bucket or 0, c.digest_id) for c in claimed if c.digest_id is not None
            ]
        )
        ready: list[ClaimedNotification] = []
        failed: list[Completion] = []
        for c in claimed:
            if c.digest_id is None:
                ready.append(c)
                continue
            digest = contents.get(c.digest_id)
            try:
                if digest is None:
                    raise DigestRenderFailed(f"digest {c.digest_id} does not exist")
                subject, body = await render_digest(
                    self._renderer or _NO_TEMPLATES, digest, c.channel
                )
            except DigestRenderFailed as exc:
                log.warning("%s: %s", c.id, exc)
                failed.append(
                    decide_completion(
                        c, DeliveryResult(Outcome.PERMANENT_FAILURE, error=str(exc)[:500])
                    )
                )
                continue
            ready.append(
                dataclasses.replace(
                    c,
                    subject=subject,
                    body=body,
                    metadata={
                        "digest": {
                            "key": digest.key,
                            "id": str(digest.id),
                            "count": len(digest.items),
                        }
                    },
                    linked_traceparents=tuple(t for t in digest.traceparents if t != c.traceparent),
                )
            )
        if failed:
            await self._repository.deliveries_complete(completions=failed)
        return ready

    async def complete(
        self, results: Sequence[tuple[ClaimedNotification, DeliveryResult]]
    ) -> tuple[list[Completion], Recorded]:
        """Decide and record; return the completions and what was recorded."""
        completions = [decide_completion(claimed, result) for claimed, result in results]
        recorded = await self._repository.deliveries_complete(completions=completions)
        return completions, recorded

    async def release(self, claims: Sequence[ClaimedNotification]) -> int:
        return await self._repository.claims_release(claims=[(c.id, c.claim_token) for c in claims])

    async def housekeeping(self) -> tuple[int, int, int]:
        """Recover expired leases and expire overdue notifications: (recovered, dead, expired)."""
        recovered, dead = await self._repository.leases_recover_expired()
        expired = await self._repository.notifications_expire_overdue()
        return recovered, dead, expired

    async def prune_rate_windows(self) -> int:
        return await self._repository.rate_windows_prune()

    async def seconds_until_due(self, *, ceiling: float) -> float:
        """Seconds until this worker's lanes next have due work, at most `ceiling`."""
        next_due, now = await self._repository.next_due_at(
            priorities=self._priorities, channels=self._channels
        )
        return _seconds_until(next_due, now, ceiling)

    async def seconds_until_housekeeping(self, *, ceiling: float) -> float:
        """Seconds until a lease runs out or a notification expires, at most `ceiling`."""
        due, now = await self._repository.housekeeping_next_due_at()
        return _seconds_until(due, now, ceiling)

    def wakeups(
        self,
        stop: asyncio.Event,
        *,
        webhook_events: bool,
        on_state: Callable[[bool], None] | None = None,
    ) -> AsyncIterator[Wakeup]:
        return self._repository.wakeups(stop, webhook_events=webhook_events, on_state=on_state)


def _seconds_until(due: datetime | None, now: datetime, ceiling: float) -> float:
    if due is None:
        return ceiling
    return min(max((due - now).total_seconds(), 0.0), ceiling)
