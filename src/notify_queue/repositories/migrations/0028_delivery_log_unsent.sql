-- The log's status index without SENT rows, so a completion writes no entry there, expand half;
-- 0029 drops the index it replaces.
--
-- Every completion wrote an entry in nq_delivery_log_status_created (status, created_at, id) for
-- its row: 88 B of WAL, its share of page splits and its CPU, for an index whose readers want
-- the rows that were not sent (the operator's batch retry of FAILED or DEAD_LETTERED rows, a
-- list of one such status). A list of SENT rows, the most of the log, reads the (created_at, id)
-- index and keeps the SENT ones, as many as it reads (notification_list's parts). So the index
-- keeps the other rows only, and a SENT row, the usual completion, writes no entry there.
--
-- The log is partitioned and holds the history: building an index on it in the migrator's
-- transaction would read every partition while holding the log's writers back. So the index is
-- made on the parent alone (ON ONLY: invalid, no partition read), each partition without rows
-- gets its part here (nothing to read: the days ahead, and every partition of a new database),
-- and the partitions with rows get theirs from the workers' housekeeping, built CONCURRENTLY
-- and attached (repositories/delivery_log.py); with the last one attached the index is valid,
-- which 0029 waits for. A partition made from now on gets its part when it is attached.
-- Until then a partition without its part is read through the old index, which 0029 drops.
--
-- nq_delivery_log_unsent_missing (functions/) lists the partitions without their part; `migrate`
-- defines it at the start of this step, before the index: on Citus a function made after a
-- statement on every shard of the log, in the same transaction, is refused.
-- functions: nq_delivery_log_index_missing, nq_delivery_log_unsent_missing

-- ON ONLY reads no partition; the partitions' parts are built below (empty ones) and by the
-- workers, CONCURRENTLY (the ones with rows). Through EXECUTE: on a Citus coordinator the
-- statement is sent on to the worker nodes as the text it was given, and as part of this file's
-- text it is several commands, which the nodes refuse ("cannot insert multiple commands into a
-- prepared statement"; tests/citus/test_layout.py).
DO $$
BEGIN
    EXECUTE 'CREATE INDEX nq_delivery_log_unsent ON ONLY nq_delivery_log (status, created_at, id)'
            ' WHERE status <> ''SENT''';
END $$;

DO $$
DECLARE
    m record;
BEGIN
    FOR m IN SELECT * FROM nq_delivery_log_unsent_missing() WHERE NOT has_rows LOOP
        IF m.index_valid IS DISTINCT FROM true THEN
            EXECUTE 'DROP INDEX IF EXISTS ' || quote_ident(m.index_name);
            EXECUTE 'CREATE INDEX ' || quote_ident(m.index_name) || ' ON '
                    || quote_ident(m.partition_name)
                    || ' (status, created_at, id) WHERE status <> ''SENT''';
        END IF;
        EXECUTE 'ALTER INDEX nq_delivery_log_unsent ATTACH PARTITION '
                || quote_ident(m.index_name);
    END LOOP;
END $$;
