-- transaction: none
-- Two partial indexes on the queue, built with CONCURRENTLY: nq_jobs holds the backlog, and a
-- plain CREATE INDEX would hold every create and claim back for the whole build (its SHARE lock),
-- minutes on a backlog of millions. Outside a transaction, one statement at a time; a build that
-- is interrupted is dropped and built again by the next migrate (docs/upgrading.md, "Index
-- builds on the queue"). Both read only columns 0012 added.
-- An expand step: 0.1.0 never reads these columns, and no statement names these indexes.

-- Why a notification waits (docs/design.md "Why a notification waits"): the deferred PENDING rows
-- by reason and until, for the gauge notify_queue_waiting{reason} (an index-only count per reason
-- on every scrape: queue_status_waiting) and `GET /notifications?waiting=R`
-- (notification_list_waiting). Partial: a row enters it only while it waits for a reason, so due
-- rows, claims and completions that finish a row never touch it, and the index is as small as
-- the deferred part of the backlog.
CREATE INDEX CONCURRENTLY IF NOT EXISTS nq_jobs_waiting ON nq_jobs (waiting_reason, waiting_until)
    WHERE status = 'PENDING' AND waiting_reason IS NOT NULL;

-- A digest's items in the queue (docs/digests.md): the carrier's render and completion read them
-- through this. Partial on digest_id: a plain notification writes no entry, so creates and
-- claims that never use digests pay nothing for it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS nq_jobs_digest ON nq_jobs (bucket, digest_id)
    WHERE digest_id IS NOT NULL;
