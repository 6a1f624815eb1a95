"""Notification ids (`models.time_ordered_uuid`): UUID version 7, built without `UUID(int=...)`'s
argument checks, so each must be an ordinary UUID in every way a caller uses one."""

from __future__ import annotations

import pickle
import time
import uuid

from notify_queue.models import time_ordered_uuid


def test_an_id_is_a_version_7_uuid_like_any_other() -> None:
    for _ in range(2_000):
        made = time_ordered_uuid()
        parsed = uuid.UUID(str(made))
        assert made == parsed and hash(made) == hash(parsed)
        assert made.version == 7 and made.variant == uuid.RFC_4122
        assert pickle.loads(pickle.dumps(made)) == made  # noqa: S301 (our own bytes)
        assert made.bytes == parsed.bytes


def test_ids_start_with_the_unix_milliseconds_they_were_made_at() -> None:
    before = time.time_ns() // 1_000_000
    ids = [time_ordered_uuid() for _ in range(100)]
    after = time.time_ns() // 1_000_000
    assert all(before <= made.int >> 80 <= after for made in ids)
    assert len(set(ids)) == len(ids)
