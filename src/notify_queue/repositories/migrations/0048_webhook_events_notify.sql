-- Every statement that writes webhook events wakes the relays at its commit, expand step
-- (docs/design.md "Wake-ups and scheduling").
--
-- A relay was woken only by its own worker's results: an event written anywhere else (an API
-- create suppressed at creation, the operator's create, notify_queue_enqueue in a caller's
-- transaction, another worker's expiry) waited for its safety look, up to 30 s. A statement-level
-- trigger NOTIFYs `nq_webhook_events` once per statement that inserted events, whatever wrote it;
-- NOTIFY is transactional, so it arrives at the commit and a rollback sends nothing. Identical
-- notifications of one transaction are folded into one by PostgreSQL, so a completion statement
-- of hundreds of events sends one. The transition table keeps a statement that inserted no row
-- (a completion with no webhook to call) from sending any.
--
-- Citus refuses triggers on a distributed table, and a NOTIFY on a worker node never reaches a
-- listener on the coordinator: there the trigger is not created (citus_layout.sql drops it before
-- it distributes the table), and relays find those events at their look.
CREATE FUNCTION nq_webhook_events_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM inserted) THEN
        PERFORM pg_notify('nq_webhook_events', '');
    END IF;
    RETURN NULL;
END
$$;

DO $$
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        IF EXISTS (SELECT FROM pg_catalog.pg_dist_partition
                   WHERE logicalrelid = 'nq_webhook_events'::regclass) THEN
            RETURN;
        END IF;
    END IF;
    CREATE TRIGGER nq_webhook_events_notify AFTER INSERT ON nq_webhook_events
        REFERENCING NEW TABLE AS inserted
        FOR EACH STATEMENT EXECUTE FUNCTION nq_webhook_events_notify();
END
$$;
