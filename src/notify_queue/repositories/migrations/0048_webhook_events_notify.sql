-- Every statement that writes webhook events wakes the relays at its commit, expand step
-- (docs/design.md "Wake-ups and scheduling"): a statement-level trigger calls
-- nq_webhook_events_notify (functions/), which `migrate` defines before this step runs.
--
-- Citus refuses triggers on a distributed table, and a NOTIFY on a worker node never reaches a
-- listener on the coordinator: there the trigger is not created (citus/layout.sql drops it before
-- it distributes the table), and relays find those events at their look.
-- functions: nq_webhook_events_notify
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
