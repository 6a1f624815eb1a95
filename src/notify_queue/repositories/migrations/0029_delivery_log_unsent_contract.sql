-- The log's status index without SENT rows, contract half (0028 is the expand half).
-- phase: contract
-- functions: nq_delivery_log_index_missing, nq_delivery_log_unsent_missing
--
-- This release reads the rows that were not sent through nq_delivery_log_unsent, and lists of
-- SENT rows through the (created_at, id) index; the previous release read
-- nq_delivery_log_status_created, which every completion wrote an entry in. It is dropped once
-- no process of that release is connected and nq_delivery_log_unsent is whole: every partition
-- with rows before 0028 gets its part from the workers' housekeeping (built CONCURRENTLY, at a
-- worker's start and hourly), and until then those partitions are read through the old index.
-- The drop through EXECUTE, in the same block: on a Citus coordinator a statement is sent on to
-- the worker nodes as the text it was given, and as part of this file's text it is several
-- commands, which the nodes refuse (0028).
-- A drop holds the ACCESS EXCLUSIVE lock on the log for the moment it takes to unlink the index
-- and its parts (no scan; CONCURRENTLY cannot run in the migrator's transaction, nor on a
-- partitioned index), and the migrator gives up a lock wait after 2 s and tries again
-- (repositories/schema.py), so completions queue behind it that long at most.
DO $$
DECLARE
    left_to_build integer;
BEGIN
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
