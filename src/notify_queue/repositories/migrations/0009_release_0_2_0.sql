-- 0.2.0's expand steps in one: from 0.1.0's schema to 0.2.0's, while 0.1.0 serves. A database
-- that recorded 0.2.0's last expand step (0043) has all of this (docs/upgrading.md, "The history
-- squashed"); the queue's index builds are 0010, outside a transaction; the contract half is
-- 0015 and 0022. This step runs before the Citus layout (it distributes a schema with no
-- contract step waiting), so its DDL needs no EXECUTE.
--
-- docs/design.md ("The queue's tables") has the reasons; in short:
-- 1. The unfinished notifications gain columns: `bucket` (the distribution column on Citus,
--    docs/scaling.md), why a row waits (`waiting_*`), its digest and escalation, its trace
--    context. 0.1.0 reads nq_queue with `RETURNING *` in server-prepared statements, which a new
--    column breaks, so the table becomes nq_jobs and nq_queue a view of exactly 0.1.0's columns.
-- 2. 0.2.0 writes every consequence of a status change in the statement that makes it (Citus
--    refuses triggers): 0.1.0's triggers stay until the contract step, silent in a session of
--    0.2.0 or later (nq_explicit_session).
-- 3. The rolling rate-limit window is one row per recipient (nq_rate_windows) instead of one
--    slot row per delivery (0.1.0's nq_rate_slots, dropped by the contract step).
-- 4. Digests, escalations and voice numbers, the log's index of rows not sent, the request's hash
--    kept once with its key, and the log's partitions published whole to logical replication.
--
-- The functions this step and the kept triggers call are today's text, defined at its start:
-- functions: nq_bucket, nq_count, nq_note_changes, nq_delivery_log_ready, nq_webhook_payload, nq_insert_webhook_events, nq_finish_held, nq_retry, nq_delivery_log_index_missing, nq_delivery_log_unsent_missing

-- The request's hash kept once, with its key, as 16 bytes (`request_digest`); the key's hex form
-- and the rows' copy (below) become nullable; 0.1.0 reads and writes them until the contract step.
-- First, before the queue: 0.1.0's create locks the keys, then the queue, in one statement; a
-- step holding the queue while it waits for the keys would deadlock with it (docs/upgrading.md).
ALTER TABLE nq_idempotency_keys ADD COLUMN request_digest bytea;
-- Why: 0.1.0 keeps writing the hash with every key; only this release leaves it out.
-- squawk-ignore ban-drop-not-null
ALTER TABLE nq_idempotency_keys ALTER COLUMN request_hash DROP NOT NULL;

-- True in a session of 0.2.0 or later (application_name `<role>@<release>`, repositories/db.py),
-- which writes the consequences of its changes itself; or in a transaction that set
-- `nq.explicit` (0.1.0's entry into nq_retry, below).
CREATE FUNCTION nq_explicit_session() RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
RETURN current_setting('application_name') ~ '^notify-queue-[a-z-]+@[0-9]'
    OR current_setting('nq.explicit', true) = 'on';

-- 0.1.0's counting and status-outbox triggers do nothing in such a session: each function gets
-- that test at the top of its body, its text otherwise as 0.1.0 made it (a truncate still
-- clears the counters).
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOREACH f IN ARRAY ARRAY['nq_count_changes()', 'nq_status_outbox_capture()']::regprocedure[]
    LOOP
        EXECUTE regexp_replace(pg_get_functiondef(f), '\nBEGIN\n',
            E'\nBEGIN\n    IF TG_OP <> ''TRUNCATE'' AND nq_explicit_session() THEN\n'
            '        RETURN NULL;\n    END IF;\n');
    END LOOP;
END $$;

-- Why: 0.1.0 keeps reading and writing the same rows through the view created below.
-- squawk-ignore renaming-table
ALTER TABLE nq_queue RENAME TO nq_jobs;
-- Why: the indexes follow their table's name; no statement names an index.
-- squawk-ignore renaming-object
ALTER INDEX nq_queue_pkey RENAME TO nq_jobs_pkey;
-- Why: as above.
-- squawk-ignore renaming-object
ALTER INDEX nq_queue_claim RENAME TO nq_jobs_claim;
-- Why: as above.
-- squawk-ignore renaming-object
ALTER INDEX nq_queue_lease RENAME TO nq_jobs_lease;
-- Why: as above.
-- squawk-ignore renaming-object
ALTER INDEX nq_queue_expiry RENAME TO nq_jobs_expiry;
-- Why: as above.
-- squawk-ignore renaming-object
ALTER INDEX nq_queue_created RENAME TO nq_jobs_created;

ALTER TABLE nq_jobs
    ADD COLUMN bucket smallint,
    ADD COLUMN waiting_reason text,
    ADD COLUMN waiting_until timestamptz,
    ADD COLUMN waiting_detail text,
    ADD COLUMN digest_id uuid,
    ADD COLUMN escalation_id uuid,
    ADD COLUMN traceparent text;
ALTER TABLE nq_delivery_log
    ADD COLUMN bucket smallint,
    ADD COLUMN digest_id uuid,
    ADD COLUMN escalation_id uuid,
    ADD COLUMN traceparent text;

-- The queue is all churn, and a burst can grow it from nothing to 100,000 rows in seconds:
-- analyse and vacuum after a few hundred changes or 2%, so the statistics follow the backlog.
-- A claim rewrites every row it admits; at fillfactor 45 each row of a page has room for its
-- claimed version there, logged short (docs/performance.md, tests/test_claim_page.py). Only
-- pages filled from now on; the lock lets claims and creates go on.
ALTER TABLE nq_jobs SET (
    autovacuum_analyze_threshold = 500, autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_threshold = 1000, autovacuum_vacuum_insert_scale_factor = 0.02);
ALTER TABLE nq_jobs SET (fillfactor = 45);

-- The backlog's buckets; rows 0.1.0 inserts through the view get theirs from the trigger below.
UPDATE nq_jobs SET bucket = nq_bucket(COALESCE(recipient_id, recipient)) WHERE bucket IS NULL;

CREATE FUNCTION nq_jobs_fill_bucket() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.bucket := nq_bucket(COALESCE(NEW.recipient_id, NEW.recipient));
    RETURN NEW;
END $$;
CREATE TRIGGER nq_jobs_fill_bucket BEFORE INSERT ON nq_jobs
    FOR EACH ROW WHEN (NEW.bucket IS NULL) EXECUTE FUNCTION nq_jobs_fill_bucket();

-- 0.1.0's view of the queue: its columns, in its order.
CREATE VIEW nq_queue AS
SELECT id, idempotency_key, request_hash, channel, recipient, subject, body, priority, status,
       send_at, next_attempt_at, expires_at, attempt_count, max_attempts, last_error, sent_at,
       provider_message_id, claim_token, lease_expires_at, retries, source, policy, webhook_url,
       metadata, created_at, updated_at, finished_at, recipient_id, category, template_name,
       template_version, provider, delivery_attempts
FROM nq_jobs;

-- 0.1.0's move of finished rows, through today's move with the values the UPDATE set (its
-- own triggers count the change and queue the status write: p_note false).
CREATE OR REPLACE FUNCTION nq_queue_move_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    finished uuid[];
BEGIN
    IF nq_explicit_session() THEN
        RETURN NULL;
    END IF;
    finished := ARRAY(SELECT id FROM nq_new WHERE status NOT IN ('PENDING', 'PROCESSING'));
    IF cardinality(finished) > 0 THEN
        PERFORM nq_finish_held(finished, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, false);
    END IF;
    RETURN NULL;
END $$;

-- Webhook events carry their notification's bucket (co-located with it on Citus). Nullable:
-- 0.1.0 inserts events without it; the Citus layout fills the missing ones.
ALTER TABLE nq_webhook_events ADD COLUMN bucket smallint;

-- The rolling window, one row per recipient: the deliveries it counts (notification and time,
-- oldest first). Keyed (bucket, recipient) to live beside the recipient's notifications on
-- Citus. Only the key has a btree index, so the claim's update is HOT; the BRIN (which does not
-- stop HOT) lets housekeeping find old rows.
CREATE TABLE nq_rate_windows (
    bucket        smallint NOT NULL,
    recipient     text NOT NULL,
    ids           uuid[] NOT NULL,
    taken         timestamptz[] NOT NULL,
    last_taken_at timestamptz NOT NULL,
    PRIMARY KEY (bucket, recipient)
) WITH (fillfactor = 70, autovacuum_vacuum_threshold = 1000,
        autovacuum_vacuum_scale_factor = 0.02);
-- Why: nq_rate_windows is created in this same file, empty.
-- squawk-ignore require-concurrent-index-creation
CREATE INDEX nq_rate_windows_last_taken ON nq_rate_windows USING brin (last_taken_at);

-- 0.1.0's slots still in a window carry over, so the limit holds across the upgrade.
INSERT INTO nq_rate_windows (bucket, recipient, ids, taken, last_taken_at)
SELECT nq_bucket(COALESCE(j.recipient_id, s.recipient)), s.recipient,
       array_agg(s.notification_id ORDER BY s.taken_at), array_agg(s.taken_at ORDER BY s.taken_at),
       max(s.taken_at)
FROM nq_rate_slots s LEFT JOIN nq_jobs j ON j.id = s.notification_id
GROUP BY 1, 2
ON CONFLICT (bucket, recipient) DO NOTHING;

-- 0.1.0's retry, which it calls by name and reads with `*`: today's nq_retry, answered with the
-- view's rows. Why: its result type is now the view's row type, which cannot change in place.
-- squawk-ignore ban-drop-function
DROP FUNCTION nq_delivery_log_retry(uuid[]);
CREATE FUNCTION nq_delivery_log_retry(p_ids uuid[]) RETURNS SETOF nq_queue
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    retried uuid[];
BEGIN
    -- nq_retry writes the counters and status writes itself: the triggers stay silent for the
    -- rest of this transaction.
    PERFORM set_config('nq.explicit', 'on', true);
    retried := ARRAY(SELECT nq_retry(p_ids));
    -- A statement of its own, so it sees the rows the retry inserted.
    RETURN QUERY SELECT * FROM nq_queue WHERE id = ANY(retried);
END $$;

-- Every notification, unfinished or finished, with the columns each has.
CREATE VIEW nq_all_notifications AS
SELECT id, idempotency_key, request_hash, channel, recipient, subject, body, priority, status,
       send_at, next_attempt_at, expires_at, attempt_count, max_attempts, last_error, sent_at,
       provider_message_id, retries, source, policy, webhook_url, metadata, created_at,
       updated_at, finished_at, recipient_id, category, template_name, template_version, provider,
       delivery_attempts, bucket, waiting_reason, waiting_until, waiting_detail, digest_id,
       escalation_id, traceparent, claim_token, lease_expires_at
FROM nq_jobs
UNION ALL
SELECT id, idempotency_key, request_hash, channel, recipient, subject, body, priority, status,
       send_at, next_attempt_at, expires_at, attempt_count, max_attempts, last_error, sent_at,
       provider_message_id, retries, source, policy, webhook_url, metadata, created_at,
       updated_at, finished_at, recipient_id, category, template_name, template_version, provider,
       delivery_attempts, bucket, NULL, NULL, NULL, digest_id, escalation_id, traceparent, NULL,
       NULL
FROM nq_delivery_log;

-- The rate windows' entries one per row, for people and tests reading them.
CREATE VIEW nq_rate_window_entries AS
SELECT e.notification_id, w.bucket, w.recipient, e.taken_at
FROM nq_rate_windows w, unnest(w.ids, w.taken) AS e(notification_id, taken_at);

-- Digests (docs/digests.md): a recipient's open collection for one key on one channel; its
-- items are queue rows with digest_id, one of them (the carrier) sends the digest. Keyed
-- (bucket, id), co-located with the queue on Citus.
CREATE TABLE nq_digests (
    bucket smallint NOT NULL,
    id uuid NOT NULL,
    recipient text NOT NULL,
    channel text NOT NULL,
    key text NOT NULL,
    -- open: items join it; closed: its carrier was claimed (or maxItems joined); cancelled:
    -- every item left it while open.
    state text NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'closed', 'cancelled')),
    opened_at timestamptz NOT NULL DEFAULT now(),
    closes_at timestamptz NOT NULL,
    closed_at timestamptz,
    max_items integer NOT NULL,
    item_count integer NOT NULL,
    template text,
    -- The item that sends the digest: the first to join, the oldest left if it is cancelled.
    carrier_id uuid NOT NULL,
    PRIMARY KEY (bucket, id)
);
-- At most one open digest per recipient, channel and key (the arbiter of nq_digest_join).
CREATE UNIQUE INDEX nq_digests_open ON nq_digests (bucket, recipient, channel, key)
    WHERE state = 'open';
-- Retention of closed digests.
CREATE INDEX nq_digests_closed ON nq_digests (closed_at) WHERE state <> 'open';

-- Escalation until acknowledged (docs/escalation.md): one row per escalation, keyed like the
-- queue; its steps are notifications (nq_jobs.escalation_id), listed in step order in step_ids.
CREATE TABLE nq_escalations (
    bucket          smallint NOT NULL,
    id              uuid NOT NULL,
    recipient_id    text NOT NULL,
    -- The request's key: its first step has it, later steps "<key> step<N>" (services).
    idempotency_key text NOT NULL,
    -- The steps' notification ids in step order, and each step's channel and afterSeconds.
    step_ids        uuid[] NOT NULL,
    steps           jsonb NOT NULL,
    acknowledged_at timestamptz,
    acknowledged_by text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (bucket, id)
);
-- GET /escalations/{id} and the acknowledgement know only the id.
CREATE INDEX nq_escalations_id ON nq_escalations (id);

-- A recipient's voice number, a table of its own: 0.1.0 reads recipients with `SELECT *`.
CREATE TABLE nq_recipient_voices (
    recipient_id text PRIMARY KEY,
    voice        text NOT NULL
);

-- The channel is checked where every row comes in (services.validation, nq_enqueue_errors): the
-- queue's and the log's channel checks would refuse `voice`, and a CHECK cannot be widened.
-- Why: widening the channels removes no guarantee 0.1.0 relies on: it writes email, sms, push.
-- squawk-ignore ban-drop-constraint
ALTER TABLE nq_jobs DROP CONSTRAINT IF EXISTS nq_queue_channel_check;
-- Why: as above, the log's copy of the same check.
-- squawk-ignore ban-drop-constraint
ALTER TABLE nq_delivery_log DROP CONSTRAINT IF EXISTS nq_delivery_log_channel_check;

-- The log's status index without SENT rows (a SENT completion writes no entry there), made on
-- the log alone (ON ONLY: no partition read); each partition without rows gets its part here,
-- those with rows get theirs from the workers' housekeeping, CONCURRENTLY (docs/upgrading.md,
-- "Writing a migration"); the contract step waits for the last one.
-- Why: ON ONLY reads no partition and blocks no writer for longer than the catalog change.
-- squawk-ignore require-concurrent-index-creation
CREATE INDEX nq_delivery_log_unsent ON ONLY nq_delivery_log (status, created_at, id)
    WHERE status <> 'SENT';
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

-- The rows' copy of the request's hash becomes nullable (the key's, above); 0.1.0 writes it
-- until the contract step.
-- Why: 0.1.0 keeps writing the hash in every row; only this release leaves it out.
-- squawk-ignore ban-drop-not-null
ALTER TABLE nq_jobs ALTER COLUMN request_hash DROP NOT NULL;
-- Why: as above, the log's copy.
-- squawk-ignore ban-drop-not-null
ALTER TABLE nq_delivery_log ALTER COLUMN request_hash DROP NOT NULL;

-- Every partition of the log publishes its changes whole to logical replication, which a Citus
-- shard move needs (docs/scaling.md, "Adding worker nodes"); partitions made later get it from
-- nq_delivery_log_prepare. A catalog change only, no rewrite.
DO $$
DECLARE
    part text;
BEGIN
    FOR part IN
        SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'nq_delivery_log'::regclass AND c.relreplident <> 'f'
        ORDER BY c.relname
    LOOP
        EXECUTE 'ALTER TABLE ' || quote_ident(part) || ' REPLICA IDENTITY FULL';
    END LOOP;
END $$;
