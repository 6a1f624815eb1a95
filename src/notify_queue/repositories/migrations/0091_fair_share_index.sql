-- transaction: none
-- Fair share (docs/quotas.md, "Fair share"): the claim takes each lane's tenants in turn, so it
-- needs each (priority, tenant) queue's head in due order, and the lane's tenants by a loose
-- index scan (one probe per tenant, whatever its backlog). Partial on PENDING as the claim index
-- (nq_jobs_claim), which stays for what reads a lane across tenants (next_due_at, the Citus look).
-- Built with CONCURRENTLY, outside a transaction: a plain build would hold every create and claim
-- back for minutes on a backlog of millions (docs/upgrading.md, "Index builds on the queue").
-- An expand step: the previous release never reads the tenant column, nor names this index.
CREATE INDEX CONCURRENTLY IF NOT EXISTS nq_jobs_fair
    ON nq_jobs (priority, tenant, next_attempt_at, created_at)
    WHERE status = 'PENDING';
