"""kopf's bookkeeping kept in the operator's memory: handling an object writes nothing to it.

kopf records, per object, the progress of its handlers and the last-handled essence (its
diff-base, what it compares the next event with). Its stock storages keep both in annotations:
one more PATCH of every object beside the status write. Here both live in this process: the
progress only while a handler runs or waits for its retry (kopf purges it once done), the
diff-base until the object's DELETED event (`forget`). A restarted operator starts empty, so kopf
sees every object as new and runs its create handler again; that handler skips an object that
already has a status and is idempotent otherwise (docs/operator.md "Writes per notification").

A settled Notification (finished, and no escalation an acknowledgement could still stop) has
nothing left for a handler to do, so neither its diff-base nor kopf's per-object memory is kept:
its next event is compared with itself (no change, no handler) and a fresh memory is made and
dropped. So what the operator keeps grows with the objects that can still change, not with the
objects it has seen (docs/operator.md "Memory").

A retry still writes: kopf wakes itself after a retry's delay by touching the object (a dummy
annotation), so only a handler that failed costs that write.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any, cast

import kopf
from kopf._core.reactor.inventory import ResourceMemories, ResourceMemory

from notify_queue.models import FINAL_STATUSES
from notify_queue.services.kube import PHASES, REJECTED

SETTLED_PHASES = frozenset({PHASES[status] for status in FINAL_STATUSES} | {REJECTED})


def settled(body: Mapping[str, Any]) -> bool:
    """A Notification whose phase is final and whose escalation (if any) no longer waits for an
    acknowledgement: no handler has anything left to do for it."""
    if body.get("kind") != "Notification":
        return False
    status = body.get("status") or {}
    escalation = status.get("escalation") or {}
    return status.get("phase") in SETTLED_PHASES and escalation.get("state") != "active"


def _uid(body: kopf.Body) -> str:
    return str(body.get("metadata", {}).get("uid", ""))


class MemoryProgressStorage(kopf.ProgressStorage):
    """Handler progress by object uid and handler id; the touch is kopf's annotation one."""

    def __init__(self, *, prefix: str) -> None:
        self._records: dict[str, dict[str, kopf.ProgressRecord]] = {}
        self._touch = kopf.AnnotationsProgressStorage(prefix=prefix)

    def fetch(self, *, key: kopf.HandlerId, body: kopf.Body) -> kopf.ProgressRecord | None:
        record = self._records.get(_uid(body), {}).get(key)
        return None if record is None else cast(kopf.ProgressRecord, dict(record))

    def store(
        self,
        *,
        key: kopf.HandlerId,
        record: kopf.ProgressRecord,
        body: kopf.Body,
        patch: kopf.Patch,
    ) -> None:
        self._records.setdefault(_uid(body), {})[key] = cast(kopf.ProgressRecord, dict(record))

    def purge(self, *, key: kopf.HandlerId, body: kopf.Body, patch: kopf.Patch) -> None:
        uid = _uid(body)
        records = self._records.get(uid)
        if records is not None:
            records.pop(key, None)
            if not records:
                del self._records[uid]

    def touch(self, *, body: kopf.Body, patch: kopf.Patch, value: str | None) -> None:
        self._touch.touch(body=body, patch=patch, value=value)

    def clear(self, *, essence: kopf.BodyEssence) -> kopf.BodyEssence:
        return copy.deepcopy(essence)

    def forget(self, uid: str) -> None:
        self._records.pop(uid, None)

    def __len__(self) -> int:
        return len(self._records)


class MemoryDiffBaseStorage(kopf.DiffBaseStorage):
    """The last-handled essence by object uid.

    Of the annotations under `prefix` the essence keeps only `kept` (`notifyqueue.io/acknowledged`
    is an annotation a user sets, and kopf must report its change); the rest under the prefix are
    bookkeeping an older operator left on the object, never a change to handle.
    """

    def __init__(self, *, prefix: str, kept: Iterable[str]) -> None:
        super().__init__()
        self._prefix = prefix
        self._kept = frozenset(kept)
        self._essences: dict[str, kopf.BodyEssence] = {}

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        essence = super().build(body=body, extra_fields=extra_fields)
        annotations = dict(body.get("metadata", {}).get("annotations") or {})
        ours = {
            key: value
            for key, value in annotations.items()
            if not key.startswith(f"{self._prefix}/") or key in self._kept
        }
        ours.pop("kubectl.kubernetes.io/last-applied-configuration", None)
        mutable = cast(dict[str, Any], essence)
        if ours:
            mutable.setdefault("metadata", {})["annotations"] = ours
        else:
            mutable.get("metadata", {}).pop("annotations", None)
        self.remove_empty_stanzas(essence)
        return essence

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        if settled(body):
            # Compared with itself: nothing changed. The one extra field kopf adds to a
            # Notification's essence (the acknowledgement) is an annotation `build` keeps anyway.
            self._essences.pop(_uid(body), None)
            return self.build(body=body)
        return self._essences.get(_uid(body))

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        if settled(body):
            self._essences.pop(_uid(body), None)
        else:
            self._essences[_uid(body)] = essence

    def forget(self, uid: str) -> None:
        self._essences.pop(uid, None)

    def __len__(self) -> int:
        return len(self._essences)


class SettledForgettingMemories(ResourceMemories):
    """kopf's per-object memories (its handlers' state between events), none kept for a settled
    Notification: a fresh one serves each of its events."""

    async def recall(
        self,
        raw_body: kopf.RawBody,
        *,
        memobase: Any = None,
        noticed_by_listing: bool = False,
        ephemeral: bool = False,
    ) -> ResourceMemory:
        if settled(raw_body):
            await self.forget(raw_body)
            ephemeral = True
        return await super().recall(
            raw_body, memobase=memobase, noticed_by_listing=noticed_by_listing, ephemeral=ephemeral
        )

    def __len__(self) -> int:
        return sum(1 for _ in self.iter_all_memories())
