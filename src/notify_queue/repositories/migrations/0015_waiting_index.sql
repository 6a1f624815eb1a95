-- Why a notification waits (CONTRACT section 10, docs/design.md "Why a notification waits"): the
-- deferred PENDING rows by reason and until, for the gauge notify_queue_waiting{reason} (an
-- index-only count per reason on every scrape: queue_status_waiting) and `GET
-- /notifications?waiting=R` (notification_list_waiting). Partial: a row enters it only while it
-- waits for a reason, so due rows, claims and completions that finish a row never touch it, and
-- the index is as small as the deferred part of the backlog.
-- An expand step: 0.1.0 never reads or writes these columns.

-- Why: CONCURRENTLY cannot run inside a transaction, and the migrator runs each file in one
-- (with its ledger record, so a failed step leaves nothing behind). nq_jobs holds only the
-- unfinished notifications (0013/0014: finished ones are in nq_delivery_log), so the build reads
-- the backlog, not the history; its SHARE lock holds creates and claims back for that read only,
-- during the pre-upgrade migrate. A backlog of millions is the case to schedule migrate for.
-- squawk-ignore require-concurrent-index-creation
CREATE INDEX nq_jobs_waiting ON nq_jobs (waiting_reason, waiting_until)
    WHERE status = 'PENDING' AND waiting_reason IS NOT NULL;
