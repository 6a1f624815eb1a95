-- 0.2.0's contract steps in one: what only 0.1.0 used, dropped once no process of 0.1.0 is
-- connected (0009 is the expand half). A database that recorded 0.2.0's last contract step
-- (0036) has it done; one that stopped part way through 0.2.0's contract steps gets the rest:
-- every statement here skips what is gone already.
-- phase: contract
-- functions: nq_delivery_log_index_missing, nq_delivery_log_unsent_missing

-- The log's old status index goes once the index without SENT rows is whole: until the
-- workers' housekeeping has built its part on every partition with rows, nothing here is
-- applied, and `migrate --contract` says so (ContractStepWaits).
DO $$
DECLARE
    left_to_build integer;
BEGIN
    IF to_regclass('nq_delivery_log_status_created') IS NULL THEN
        RETURN;
    END IF;
    IF NOT (SELECT indisvalid FROM pg_index
            WHERE indexrelid = 'nq_delivery_log_unsent'::regclass) THEN
        left_to_build := (SELECT count(*) FROM nq_delivery_log_unsent_missing());
        -- NQW01: the migrator's ContractStepWaits (repositories/schema.py).
        RAISE EXCEPTION USING ERRCODE = 'NQW01', MESSAGE =
            'the delivery log''s index nq_delivery_log_unsent is not built on ' || left_to_build
            || ' partitions yet; a running worker builds them (at its start and hourly): run '
            || 'migrate --contract again once it has';
    END IF;
    EXECUTE 'DROP INDEX nq_delivery_log_status_created';
END $$;

-- Why: 0.1.0's view of the queue, with its retry (it returns the view's rows).
-- squawk-ignore ban-drop-view
DROP VIEW IF EXISTS nq_queue CASCADE;
-- Why: 0.1.0's view of every notification; 0.2.0 reads nq_all_notifications.
-- squawk-ignore ban-drop-view
DROP VIEW IF EXISTS nq_notifications;

-- 0.1.0's triggers: 0.2.0 writes the move, the counters and the status outbox itself.
DROP TRIGGER IF EXISTS nq_jobs_fill_bucket ON nq_jobs;
DROP TRIGGER IF EXISTS nq_queue_move_finished_update ON nq_jobs;
DROP TRIGGER IF EXISTS nq_queue_move_finished_insert ON nq_jobs;
DROP TRIGGER IF EXISTS nq_queue_status_outbox ON nq_jobs;
DROP TRIGGER IF EXISTS nq_queue_status_outbox_insert ON nq_jobs;
DROP TRIGGER IF EXISTS nq_delivery_log_count_insert ON nq_delivery_log;
DROP TRIGGER IF EXISTS nq_delivery_log_count_delete ON nq_delivery_log;
DROP TRIGGER IF EXISTS nq_delivery_log_count_truncate ON nq_delivery_log;
DROP TRIGGER IF EXISTS nq_webhook_events_count_insert ON nq_webhook_events;
DROP TRIGGER IF EXISTS nq_webhook_events_count_update ON nq_webhook_events;
DROP TRIGGER IF EXISTS nq_webhook_events_count_delete ON nq_webhook_events;
DROP TRIGGER IF EXISTS nq_webhook_events_count_truncate ON nq_webhook_events;
-- Why: only 0.1.0's triggers and view used these.
-- squawk-ignore ban-drop-function
DROP FUNCTION IF EXISTS nq_jobs_fill_bucket(), nq_queue_move_finished(),
    nq_status_outbox_capture(), nq_count_changes(), nq_explicit_session();
-- Why: 0.1.0's webhook-event insert (7 arguments, no buckets) and 0.2.0's first move (a database
-- of 0.2.0 may still have it); today's are functions/nq_insert_webhook_events, nq_finish_held.
-- squawk-ignore ban-drop-function
DROP FUNCTION IF EXISTS
    nq_insert_webhook_events(uuid[], text[], integer[], text[], text[], text, text[]),
    nq_finish(uuid[], text[], text[], integer[], text[], text[], jsonb[], text, boolean);

-- Why: 0.1.0's rate limit, replaced by nq_rate_windows (0009).
-- squawk-ignore ban-drop-table
DROP TABLE IF EXISTS nq_rate_slots;

-- Why: the list reads PENDING rows through nq_jobs_pending_created (0010) now. A drop holds its
-- lock for the moment of an unlink; CONCURRENTLY cannot run in this transaction.
-- squawk-ignore require-concurrent-index-deletion
DROP INDEX IF EXISTS nq_jobs_created;

-- The queue holds unfinished notifications only: with the move trigger gone, a final status
-- written by hand would leave a row where no claim or list expects it. Validated by 0022, in a
-- transaction of its own.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_constraint WHERE conname = 'nq_jobs_unfinished'
                   AND conrelid = 'nq_jobs'::regclass) THEN
        ALTER TABLE nq_jobs ADD CONSTRAINT nq_jobs_unfinished
            CHECK (status IN ('PENDING', 'PROCESSING')) NOT VALID;
    END IF;
END $$;
