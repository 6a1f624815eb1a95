-- The distributed layout on a Citus coordinator with worker nodes (docs/scaling.md "Citus: the
-- layout"). Not a numbered migration: `notify-queue migrate` runs it
-- after the migrations whenever the engine is Citus (repositories/schema.py), and every part of
-- it skips what pg_dist_partition already has, so running it again changes nothing. On plain
-- PostgreSQL it never runs: the schema there stays the migrations' alone.
--
-- - The tables that grow with the notifications are hash-distributed by `bucket` (nq_bucket of
--   the recipient, 0009) and co-located: the queue, the log, the rate windows and the webhook
--   events of one recipient live on one shard, so a claim, a completion, a rate-limit window and
--   the relay's claim each name one bucket and route to one node.
-- - The idempotency keys are distributed by key: their uniqueness is the key's own, and a
--   constraint on a distributed table must include its distribution column.
-- - The counters are distributed by their shard column, co-located with the queue (a
--   connection's own row, or a delegated function's bucket row: writes spread, the reader sums
--   every shard).
-- - The small tables every delivery reads (policies, recipients, templates) are reference
--   tables: a copy on every node, so a router statement on any shard can join them. So are the
--   suppression list and the delivery receipts, which a notification's answer joins.
-- - The providers' send schedules and circuits (nq_provider_schedule, nq_provider_circuits) stay
--   plain tables on the coordinator (and the providers that resolve on acknowledge,
--   nq_provider_resolvers, read and written alone): a handful of rows written on every delivery and joined with
--   no distributed table. A write there is one hop and a local commit, where a reference table
--   would write every node under two-phase commit; and Citus refuses the provider statements'
--   clock_timestamp(), gen_random_uuid() and make_interval(column) in an UPDATE of a reference
--   table (docs/scaling.md "Citus: providers").
-- - The operator's tables (Kubernetes links, status outbox) stay plain tables on the coordinator:
--   every status change of an object's row writes an outbox row in its transaction (a local insert
--   there, where a reference table writes every node under two-phase commit), the operator locks
--   and deletes them (FOR UPDATE is refused on a reference table joined to distributed ones), and
--   no statement that runs on a worker node reads them (citus/statements.sql, "the operator's
--   statements").
--
-- A table distributed with rows in it (an installation moved onto Citus: docs/scaling.md, "Moving an
-- installation onto Citus") has them copied into its shards, and Citus leaves the coordinator's
-- local copy on disk, invisible to every query: truncate_local_data_after_distributing_table frees
-- it at once (no propagation: the shards keep theirs). A new installation's tables are empty.
--
-- Shard count 16 for every distributed table: 64 buckets over 16 shards (4 buckets a shard on
-- average), room for up to 16 worker nodes after a rebalance; the log has one distributed table
-- per daily partition, so 16 shards keeps 74 partitions at 1,184 shards where Citus's default (32)
-- made 2,368 (docs/scaling.md).
DO $layout$
DECLARE
    shards CONSTANT integer := 16;
    t text;
BEGIN
    -- Citus refuses triggers on distributed tables. The events' NOTIFY (0048) goes: a NOTIFY on
    -- a worker node would never reach the coordinator's listeners anyway.
    IF NOT EXISTS (SELECT FROM pg_dist_partition
                   WHERE logicalrelid = 'nq_webhook_events'::regclass) THEN
        DROP TRIGGER IF EXISTS nq_webhook_events_notify ON nq_webhook_events;
    END IF;
    -- The contract steps that drop 0.1.0's triggers must be applied first (a fresh database gets
    -- them with the rest).
    IF EXISTS (SELECT FROM pg_trigger
               WHERE tgrelid IN ('nq_jobs'::regclass, 'nq_delivery_log'::regclass,
                                 'nq_webhook_events'::regclass)
                 AND NOT tgisinternal) THEN
        RAISE EXCEPTION 'the distributed layout needs the contract steps first: run '
                        '`notify-queue migrate --contract`';
    END IF;

    -- Webhook events get their notification's bucket (0009) while every table is still local
    -- (Citus plans no such join between a distributed and a local table).
    IF NOT EXISTS (SELECT FROM pg_dist_partition
                   WHERE logicalrelid = 'nq_webhook_events'::regclass) THEN
        UPDATE nq_webhook_events e SET bucket = COALESCE(
            (SELECT a.bucket FROM nq_all_notifications a WHERE a.id = e.notification_id LIMIT 1),
            nq_bucket(e.notification_id::text))
        WHERE e.bucket IS NULL;
    END IF;

    -- The queue: primary key (bucket, id) (a distributed table's keys include its distribution
    -- column), and an index on id for the reads that know only the id (one probe per shard).
    IF NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'nq_jobs'::regclass) THEN
        UPDATE nq_jobs SET bucket = nq_bucket(COALESCE(recipient_id, recipient))
        WHERE bucket IS NULL;
        ALTER TABLE nq_jobs ALTER COLUMN bucket SET NOT NULL;
        ALTER TABLE nq_jobs DROP CONSTRAINT nq_jobs_pkey;
        ALTER TABLE nq_jobs ADD PRIMARY KEY (bucket, id);
        CREATE INDEX IF NOT EXISTS nq_jobs_id ON nq_jobs (id);
        PERFORM create_distributed_table('nq_jobs', 'bucket', shard_count => shards,
                                         colocate_with => 'none');
        PERFORM truncate_local_data_after_distributing_table('nq_jobs');
    END IF;

    -- The log (partitioned by day, no primary key): rows moved in before the move onto Citus get
    -- their bucket again (0009 kept none for the log's old rows).
    IF NOT EXISTS (SELECT FROM pg_dist_partition
                   WHERE logicalrelid = 'nq_delivery_log'::regclass) THEN
        UPDATE nq_delivery_log SET bucket = nq_bucket(COALESCE(recipient_id, recipient))
        WHERE bucket IS NULL;
        PERFORM create_distributed_table('nq_delivery_log', 'bucket', colocate_with => 'nq_jobs');
        PERFORM truncate_local_data_after_distributing_table('nq_delivery_log');
    END IF;

    IF NOT EXISTS (SELECT FROM pg_dist_partition
                   WHERE logicalrelid = 'nq_rate_windows'::regclass) THEN
        PERFORM create_distributed_table('nq_rate_windows', 'bucket', colocate_with => 'nq_jobs');
        PERFORM truncate_local_data_after_distributing_table('nq_rate_windows');
    END IF;

    -- Digests (0009, docs/digests.md): keyed (bucket, id) and co-located with their items, so
    -- a create joining one, the claim closing it and the cancel leaving it each name one shard.
    IF NOT EXISTS (SELECT FROM pg_dist_partition
                   WHERE logicalrelid = 'nq_digests'::regclass) THEN
        PERFORM create_distributed_table('nq_digests', 'bucket', colocate_with => 'nq_jobs');
        PERFORM truncate_local_data_after_distributing_table('nq_digests');
    END IF;

    -- Escalations (0009): keyed (bucket, id) from the start, co-located with their steps, so the
    -- claim's guard (a read of the step's escalation by (bucket, id)) stays on the step's shard.
    IF NOT EXISTS (SELECT FROM pg_dist_partition
                   WHERE logicalrelid = 'nq_escalations'::regclass) THEN
        PERFORM create_distributed_table('nq_escalations', 'bucket', colocate_with => 'nq_jobs');
        PERFORM truncate_local_data_after_distributing_table('nq_escalations');
    END IF;

    -- Webhook events: the bucket of their notification (0009), the key (bucket, id).
    IF NOT EXISTS (SELECT FROM pg_dist_partition
                   WHERE logicalrelid = 'nq_webhook_events'::regclass) THEN
        ALTER TABLE nq_webhook_events ALTER COLUMN bucket SET NOT NULL;
        ALTER TABLE nq_webhook_events DROP CONSTRAINT nq_webhook_events_pkey;
        ALTER TABLE nq_webhook_events ADD PRIMARY KEY (bucket, id);
        PERFORM create_distributed_table('nq_webhook_events', 'bucket',
                                         colocate_with => 'nq_jobs');
        PERFORM truncate_local_data_after_distributing_table('nq_webhook_events');
    END IF;

    IF NOT EXISTS (SELECT FROM pg_dist_partition
                   WHERE logicalrelid = 'nq_idempotency_keys'::regclass) THEN
        PERFORM create_distributed_table('nq_idempotency_keys', 'key', shard_count => shards,
                                         colocate_with => 'none');
        PERFORM truncate_local_data_after_distributing_table('nq_idempotency_keys');
    END IF;

    -- The counters: by their `shard` column, co-located with the queue, so a function delegated
    -- by bucket (citus/functions.sql) counts on its own node in the bucket's row (shard = the
    -- bucket); every other writer keeps its connection's row (the pid modulo 16).
    IF NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'nq_counters'::regclass) THEN
        PERFORM create_distributed_table('nq_counters', 'shard', colocate_with => 'nq_jobs');
        PERFORM truncate_local_data_after_distributing_table('nq_counters');
    END IF;

    FOREACH t IN ARRAY ARRAY['nq_policies', 'nq_templates', 'nq_recipients',
                             'nq_recipient_voices', 'nq_recipient_destinations',
                             'nq_suppressions', 'nq_delivery_receipts'] LOOP
        -- A layout of an older schema (a step before 0070, 0075 or 0076) has not all of them
        -- yet: the next migrate's layout distributes those.
        CONTINUE WHEN to_regclass(t) IS NULL;
        IF NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = t::regclass) THEN
            PERFORM create_reference_table(t);
            PERFORM truncate_local_data_after_distributing_table(t::regclass);
        END IF;
    END LOOP;
END
$layout$;
