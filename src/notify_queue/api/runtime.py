"""What the routes use, built once per process by the app's lifespan (see `app`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from notify_queue.api.metrics import QueueMetrics, SnapshotCache
from notify_queue.providers.receipts import ReceiptVerifier
from notify_queue.services.escalations import EscalationService
from notify_queue.services.notifications import NotificationService
from notify_queue.services.receipts import ReceiptService
from notify_queue.services.recipients import RecipientService


@dataclass(frozen=True)
class ApiRuntime:
    service: NotificationService
    metrics: QueueMetrics
    # What /metrics serves: the queue's figures, read again at most every few seconds.
    metrics_status: SnapshotCache
    # For readiness: the newest applied schema version (None: never migrated), and the steps this
    # code needs that the database lacks (newer steps than this code's are no reason to wait).
    schema_version: Callable[[], Awaitable[int | None]]
    missing_schema_steps: Callable[[], Awaitable[list[str]]]
    recipients: RecipientService
    escalations: EscalationService
    receipts: ReceiptService
    # Per provider that takes receipts, its scheme's verifier (docs/receipts.md).
    receipt_verifiers: Mapping[str, ReceiptVerifier]
    # The region of phone numbers written without `+` (--default-region; services/addresses.py).
    default_region: str | None = None


async def _runtime(request: Request) -> ApiRuntime:
    # async: FastAPI runs a plain `def` dependency in a worker thread, a thread hand-off on
    # every request for an attribute lookup.
    runtime: ApiRuntime = request.app.state.runtime
    return runtime


Runtime = Annotated[ApiRuntime, Depends(_runtime)]
