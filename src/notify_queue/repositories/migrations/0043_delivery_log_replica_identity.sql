-- The log's partitions publish every change they take to logical replication
-- (docs/scaling.md, "Adding worker nodes"), expand step: a property of each partition and the
-- function that makes them, replaced with its signature and result unchanged.
--
-- Citus moves a shard to another node (citus_rebalance_start, citus_move_shard_placement) by
-- logical replication while the application goes on writing, and refuses to unless every table
-- of the shard's co-location group can publish its UPDATEs and DELETEs: a primary key or a
-- replica identity. The log is partitioned by day and has no primary key (one must include the
-- partition column; the log is read by id through nq_delivery_log_id), so every move of the
-- queue's shard groups was refused, or had to block the writes of the whole group (the queue's
-- claims and completions of those buckets) while the group's history is copied
-- (shard_transfer_mode 'block_writes'). Each partition gets REPLICA IDENTITY FULL: a row deleted
-- from the log (a retry moving it back to the queue; the log takes no UPDATE) logs its whole old
-- row, and only where wal_level is `logical` (a Citus node's); at the default `replica` nothing
-- written changes.
--
-- Partitions made from now on get it before they are attached (functions/nq_delivery_log_prepare.sql). The existing ones get it here,
-- each under an ACCESS EXCLUSIVE lock held to the end of this step (a change of the catalog
-- alone, no rewrite): the migration's lock timeout and retries keep a completion or a read from
-- waiting on it for long (repositories/schema.py).
DO $$
DECLARE
    part text;
BEGIN
    FOR part IN
        SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'nq_delivery_log'::regclass AND c.relreplident <> 'f'
        ORDER BY c.relname
    LOOP
        -- Through EXECUTE: a Citus coordinator sends DDL on to its worker nodes as the text it
        -- was given (migrations/__init__.py).
        EXECUTE 'ALTER TABLE ' || quote_ident(part) || ' REPLICA IDENTITY FULL';
    END LOOP;
END $$;
