-- The queue for every engine, contract half (0012 is the expand half; docs/upgrading.md).
-- phase: contract
--
-- Applied by `migrate --contract` once no process of 0.1.0 is connected: what only 0.1.0 used.
-- 0.2.0 writes the move, the counters and the status outbox in its own statements, so the
-- triggers go (Citus refuses them on distributed tables: docs/scaling.md), with 0.1.0's view of
-- the queue, its retry function and its rate-limit slots.

-- Why: 0.1.0's view of the queue, with its retry (it returns the view's rows).
-- squawk-ignore ban-drop-view
DROP VIEW nq_queue CASCADE;
-- Why: 0.1.0's view of every notification; 0.2.0 reads nq_all_notifications.
-- squawk-ignore ban-drop-view
DROP VIEW nq_notifications;

DROP TRIGGER nq_jobs_fill_bucket ON nq_jobs;
DROP TRIGGER nq_queue_move_finished_update ON nq_jobs;
DROP TRIGGER nq_queue_move_finished_insert ON nq_jobs;
DROP TRIGGER nq_queue_status_outbox ON nq_jobs;
DROP TRIGGER nq_queue_status_outbox_insert ON nq_jobs;
DROP TRIGGER nq_delivery_log_count_insert ON nq_delivery_log;
DROP TRIGGER nq_delivery_log_count_delete ON nq_delivery_log;
DROP TRIGGER nq_delivery_log_count_truncate ON nq_delivery_log;
DROP TRIGGER nq_webhook_events_count_insert ON nq_webhook_events;
DROP TRIGGER nq_webhook_events_count_update ON nq_webhook_events;
DROP TRIGGER nq_webhook_events_count_delete ON nq_webhook_events;
DROP TRIGGER nq_webhook_events_count_truncate ON nq_webhook_events;
-- Why: only 0.1.0's triggers used it.
-- squawk-ignore ban-drop-function
DROP FUNCTION nq_jobs_fill_bucket();
-- Why: only 0.1.0's triggers used it.
-- squawk-ignore ban-drop-function
DROP FUNCTION nq_queue_move_finished();
-- Why: only 0.1.0's triggers used it.
-- squawk-ignore ban-drop-function
DROP FUNCTION nq_status_outbox_capture();
-- Why: only 0.1.0's triggers used it.
-- squawk-ignore ban-drop-function
DROP FUNCTION nq_count_changes();

-- Why: only 0.1.0's triggers used it.
-- squawk-ignore ban-drop-function
DROP FUNCTION nq_explicit_session();

-- Why: 0.1.0's webhook-event insert (7 arguments, no buckets); 0.2.0 calls the one of 0012 that
-- takes each notification's bucket.
-- squawk-ignore ban-drop-function
DROP FUNCTION nq_insert_webhook_events(uuid[], text[], integer[], text[], text[], text, text[]);

-- Why: 0.1.0's rate limit, replaced by nq_rate_windows (0012).
-- squawk-ignore ban-drop-table
DROP TABLE nq_rate_slots;

-- The queue holds unfinished notifications only: with the move trigger gone, a final status
-- written by hand (not through nq_finish) would leave a row where no claim or list expects it.
-- Validated by 0014, in a transaction of its own.
ALTER TABLE nq_jobs ADD CONSTRAINT nq_jobs_unfinished
    CHECK (status IN ('PENDING', 'PROCESSING')) NOT VALID;
