-- transaction: none
-- The claim writes one index entry fewer, expand half; 0027 drops the index it replaces.
--
-- A claim rewrites its rows (PENDING to PROCESSING), and that update is not HOT: it changes the
-- status, which the partial indexes' predicates read. A version that is not HOT gets an entry in
-- every index whose predicate it matches, so nq_jobs_created (created_at, id), which has no
-- predicate, took an entry per claim (80 B of WAL, its share of page splits and its CPU) for a
-- key the claim never changes. Its one reader is the list (GET /notifications, oldest first),
-- whose rows in flight are few (workers x batch size) and found through nq_jobs_lease, the
-- index of PROCESSING rows. So the order of the queue's rows is kept for PENDING ones only: a
-- claim writes no entry here, a retry (back to PENDING) writes one as before.
--
-- Built with CONCURRENTLY, outside a transaction, so creates and claims go on during the build
-- (docs/upgrading.md, "Index builds on the queue").
CREATE INDEX CONCURRENTLY IF NOT EXISTS nq_jobs_pending_created ON nq_jobs (created_at, id)
    WHERE status = 'PENDING';
