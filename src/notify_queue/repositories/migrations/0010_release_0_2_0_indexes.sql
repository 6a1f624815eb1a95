-- transaction: none
-- 0.2.0's partial indexes on the queue (0009 made their columns), built CONCURRENTLY: nq_jobs
-- holds the backlog, and a plain CREATE INDEX would hold every create and claim back for the
-- whole build (docs/upgrading.md, "Index builds on the queue"). An expand step: 0.1.0 never
-- reads these columns, and no statement names an index.

-- Why a notification waits (docs/design.md): the deferred PENDING rows by reason and until,
-- for the gauge notify_queue_waiting{reason} and `GET /notifications?waiting=R`. Due rows,
-- claims and completions never touch it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS nq_jobs_waiting ON nq_jobs (waiting_reason, waiting_until)
    WHERE status = 'PENDING' AND waiting_reason IS NOT NULL;

-- A digest's items (docs/digests.md), for the carrier's render and completion; a plain
-- notification writes no entry.
CREATE INDEX CONCURRENTLY IF NOT EXISTS nq_jobs_digest ON nq_jobs (bucket, digest_id)
    WHERE digest_id IS NOT NULL;

-- The list's order of PENDING rows (GET /notifications, oldest first): a claim, which is not
-- HOT, writes no entry here; the few rows in flight are found through nq_jobs_lease. Replaces
-- nq_jobs_created, which the contract step drops.
CREATE INDEX CONCURRENTLY IF NOT EXISTS nq_jobs_pending_created ON nq_jobs (created_at, id)
    WHERE status = 'PENDING';
