-- The hot queue table and the delivery log. The design and its reasons are in
-- docs/design.md ("The queue and the delivery log").
--
-- Before: one table held every notification ever sent, with nine indexes, and every
-- notification rewrote its wide row (and all nine index entries) on claim and on completion.
-- Now:
--   nq_queue         unfinished notifications only (PENDING, PROCESSING): five indexes, three
--                    of them partial. It stays as small as the backlog, so the claim, the lease
--                    recovery and the scheduler read a table that never grows with history.
--   nq_delivery_log  finished notifications, written once, partitioned by day of finished_at.
--                    Retention drops whole partitions (--retention), never DELETEs rows.
--   nq_idempotency_keys  the one place a key is unique, whichever table its notification is in.
--   nq_notifications a view over both, for reads (GET, list, the operator's joins).
-- A notification enters the log in the statement that finishes it (the move trigger below), so
-- its status, its webhook event and its status-outbox row still commit together.
-- functions: nq_delivery_log_prepare

ALTER TABLE nq_notifications RENAME TO nq_notifications_0007;

CREATE TABLE nq_queue (
    id                  uuid PRIMARY KEY,
    idempotency_key     text NOT NULL,
    request_hash        text NOT NULL,
    channel             text NOT NULL CHECK (channel IN ('email', 'sms', 'push')),
    recipient           text NOT NULL,
    subject             text,
    body                text NOT NULL,
    priority            smallint NOT NULL CHECK (priority BETWEEN 0 AND 2),
    -- A final status lives here only between the UPDATE that sets it and the end of that
    -- statement, when nq_queue_move_finished moves the row to the log.
    status              text NOT NULL CHECK (status IN ('PENDING', 'PROCESSING', 'SENT', 'FAILED',
                            'DEAD_LETTERED', 'CANCELLED', 'EXPIRED', 'SUPPRESSED')),
    send_at             timestamptz NOT NULL,
    next_attempt_at     timestamptz NOT NULL,
    expires_at          timestamptz,
    attempt_count       integer NOT NULL DEFAULT 0,
    max_attempts        integer NOT NULL,
    last_error          text,
    sent_at             timestamptz,
    provider_message_id text,
    claim_token         uuid,
    lease_expires_at    timestamptz,
    retries             jsonb NOT NULL DEFAULT '[]',
    source              text NOT NULL DEFAULT 'api',
    policy              text,
    webhook_url         text,
    metadata            jsonb NOT NULL DEFAULT '{}',
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    finished_at         timestamptz,
    recipient_id        text,
    category            text NOT NULL DEFAULT 'transactional',
    template_name       text,
    template_version    integer,
    provider            text,
    delivery_attempts   jsonb NOT NULL DEFAULT '[]',
    -- The log is partitioned by finished_at: a row cannot leave without one.
    CONSTRAINT nq_queue_finished_at CHECK (status IN ('PENDING', 'PROCESSING') OR finished_at IS NOT NULL)
) WITH (fillfactor = 80);

-- The claim index: PENDING rows in claim order (claim_lock_candidates walks it per priority).
CREATE INDEX nq_queue_claim ON nq_queue (priority, next_attempt_at, created_at)
    WHERE status = 'PENDING';
-- Leases to recover: PROCESSING rows by lease end.
CREATE INDEX nq_queue_lease ON nq_queue (lease_expires_at) WHERE status = 'PROCESSING';
-- The expiry sweep: PENDING rows that can expire (most have no expiresAt and are not in it).
CREATE INDEX nq_queue_expiry ON nq_queue (expires_at)
    WHERE status = 'PENDING' AND expires_at IS NOT NULL;
-- Listing unfinished notifications in (created_at, id) order, merged with the log's own.
-- Lists filtered by status, recipient or recipientId read this one and filter: the queue holds
-- only the backlog. The log, which holds history, has an index per filter.
CREATE INDEX nq_queue_created ON nq_queue (created_at, id);

CREATE TABLE nq_delivery_log (
    LIKE nq_queue INCLUDING DEFAULTS,
    CONSTRAINT nq_delivery_log_final CHECK (status NOT IN ('PENDING', 'PROCESSING'))
) PARTITION BY RANGE (finished_at);
ALTER TABLE nq_delivery_log ALTER COLUMN finished_at SET NOT NULL;
ALTER TABLE nq_delivery_log ADD CHECK (channel IN ('email', 'sms', 'push')),
                            ADD CHECK (priority BETWEEN 0 AND 2);

-- Partitioned indexes: each partition gets its own. Not unique on id (a unique index on a
-- partitioned table must contain the partition key); ids are unique by construction (a uuid
-- created once, and a row is in exactly one of the two tables at any commit).
CREATE INDEX nq_delivery_log_id ON nq_delivery_log (id);
CREATE INDEX nq_delivery_log_created ON nq_delivery_log (created_at, id);
CREATE INDEX nq_delivery_log_status_created ON nq_delivery_log (status, created_at, id);
CREATE INDEX nq_delivery_log_recipient_created ON nq_delivery_log (recipient, created_at, id);
CREATE INDEX nq_delivery_log_recipient_id_created ON nq_delivery_log (recipient_id, created_at, id)
    WHERE recipient_id IS NOT NULL;

-- One partition per UTC day, made ahead of time by nq_delivery_log_prepare; retention retires
-- them with nq_delivery_log_expired, nq_delivery_log_forget_keys and nq_delivery_log_drop
-- (functions/; the steps in repositories/delivery_log.py). `migrate` defines the prepare at
-- the start of this step (the header below), which calls it.

-- Partitions for the rows there are, and no more: none in a new database (the prepare below
-- makes today's on), else from the first day a row finished. Rows finished more than 35 days
-- ago go into one partition: older than the default retention, so the first retention run
-- drops them whole (with --retention 0 they stay, like all history).
DO $$
DECLARE
    first_day date := (now() AT TIME ZONE 'UTC')::date - 35;
    oldest date := (SELECT (min(COALESCE(finished_at, updated_at)) AT TIME ZONE 'UTC')::date
                    FROM nq_notifications_0007 WHERE status NOT IN ('PENDING', 'PROCESSING'));
    day date;
BEGIN
    IF oldest IS NULL THEN
        RETURN;
    END IF;
    IF oldest >= first_day THEN
        first_day := LEAST(oldest, (now() AT TIME ZONE 'UTC')::date);
    ELSE
        EXECUTE 'CREATE TABLE '
            || quote_ident('nq_delivery_log_before_' || to_char(first_day, 'YYYYMMDD'))
            || ' PARTITION OF nq_delivery_log FOR VALUES FROM (MINVALUE) TO ('
            || quote_literal(first_day::timestamp AT TIME ZONE 'UTC') || ')';
    END IF;
    -- Up to yesterday, or to the last day a row says it finished if that is later (a clock that
    -- ran ahead): every existing row must find its partition.
    FOR day IN SELECT generate_series(first_day, GREATEST(
                   (now() AT TIME ZONE 'UTC')::date - 1,
                   (SELECT (max(COALESCE(finished_at, updated_at)) AT TIME ZONE 'UTC')::date
                    FROM nq_notifications_0007 WHERE status NOT IN ('PENDING', 'PROCESSING'))),
                   '1 day')::date
    LOOP
        EXECUTE 'CREATE TABLE ' || quote_ident('nq_delivery_log_' || to_char(day, 'YYYYMMDD'))
            || ' PARTITION OF nq_delivery_log FOR VALUES FROM ('
            || quote_literal(day::timestamp AT TIME ZONE 'UTC') || ') TO ('
            || quote_literal((day + 1)::timestamp AT TIME ZONE 'UTC') || ')';
    END LOOP;
END $$;
SELECT nq_delivery_log_prepare(7);

-- Idempotency keys, unique across both tables. Written by the insert that creates the
-- notification (ON CONFLICT DO NOTHING decides which of two racing requests wins); forgotten
-- when retention drops the notification's partition.
CREATE TABLE nq_idempotency_keys (
    key             text PRIMARY KEY,
    notification_id uuid NOT NULL,
    request_hash    text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- Every row, moved: unfinished ones to the queue, finished ones to the log (a final row without
-- finished_at, which no code path wrote, takes its last update time).
INSERT INTO nq_queue SELECT * FROM nq_notifications_0007 WHERE status IN ('PENDING', 'PROCESSING');
INSERT INTO nq_delivery_log
SELECT id, idempotency_key, request_hash, channel, recipient, subject, body, priority, status,
       send_at, next_attempt_at, expires_at, attempt_count, max_attempts, last_error, sent_at,
       provider_message_id, claim_token, lease_expires_at, retries, source, policy, webhook_url,
       metadata, created_at, updated_at, COALESCE(finished_at, updated_at), recipient_id, category,
       template_name, template_version, provider, delivery_attempts
FROM nq_notifications_0007 WHERE status NOT IN ('PENDING', 'PROCESSING');
INSERT INTO nq_idempotency_keys (key, notification_id, request_hash, created_at)
SELECT idempotency_key, id, request_hash, created_at FROM nq_notifications_0007;
-- The counters (0004) already count these final rows; the log's triggers, created below, count
-- what changes from now on.
DROP TABLE nq_notifications_0007;

CREATE VIEW nq_notifications AS
    SELECT * FROM nq_queue
    UNION ALL
    SELECT * FROM nq_delivery_log;

-- The move: at the end of every statement that changes rows of the queue, the rows it made final
-- go to the log, in that statement (so in its transaction, with their webhook events). One
-- DELETE ... RETURNING and one INSERT per statement, found through the transition table, never
-- by a scan. Every path that finishes a notification (completion, lease recovery, expiry,
-- cancel, a born-suppressed insert) is moved without having to remember to.
CREATE FUNCTION nq_queue_move_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    finished uuid[] := ARRAY(SELECT id FROM nq_new WHERE status NOT IN ('PENDING', 'PROCESSING'));
BEGIN
    IF cardinality(finished) = 0 THEN
        RETURN NULL;  -- a claim, a deferral, a retry: nothing finished
    END IF;
    IF to_regclass('nq_delivery_log_' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')) IS NULL THEN
        PERFORM nq_delivery_log_prepare(7);
    END IF;
    WITH moved AS (
        DELETE FROM nq_queue q WHERE q.id = ANY(finished) RETURNING q.*
    )
    INSERT INTO nq_delivery_log SELECT * FROM moved;
    RETURN NULL;
END $$;
CREATE TRIGGER nq_queue_move_finished_update AFTER UPDATE ON nq_queue
    REFERENCING NEW TABLE AS nq_new FOR EACH STATEMENT EXECUTE FUNCTION nq_queue_move_finished();
CREATE TRIGGER nq_queue_move_finished_insert AFTER INSERT ON nq_queue
    REFERENCING NEW TABLE AS nq_new FOR EACH STATEMENT EXECUTE FUNCTION nq_queue_move_finished();

-- Counters (0004): final states are counted as rows enter and leave the log. The queue holds
-- only PENDING and PROCESSING, counted from their partial indexes.
CREATE TRIGGER nq_delivery_log_count_insert AFTER INSERT ON nq_delivery_log
    REFERENCING NEW TABLE AS nq_new FOR EACH STATEMENT EXECUTE FUNCTION nq_count_changes('notifications', 'status', 'PENDING,PROCESSING');
CREATE TRIGGER nq_delivery_log_count_delete AFTER DELETE ON nq_delivery_log
    REFERENCING OLD TABLE AS nq_old FOR EACH STATEMENT EXECUTE FUNCTION nq_count_changes('notifications', 'status', 'PENDING,PROCESSING');
CREATE TRIGGER nq_delivery_log_count_truncate AFTER TRUNCATE ON nq_delivery_log
    FOR EACH STATEMENT EXECUTE FUNCTION nq_count_changes('notifications', 'status', 'PENDING,PROCESSING');

-- The status outbox (0003): a change of a Kubernetes row is captured on the queue, where every
-- change happens (the move to the log is not a change). An INSERT is captured too: a retried
-- row comes back from the log into the queue as an insert (a new row has no link yet, so its
-- capture finds nothing).
CREATE OR REPLACE FUNCTION nq_status_outbox_capture() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO nq_status_outbox (uid, namespace, name, notification_id, old_status, new_status)
    SELECT l.uid, l.namespace, l.name, NEW.id,
           CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END, NEW.status
    FROM nq_kube_links l
    WHERE l.notification_id = NEW.id;
    IF FOUND THEN
        PERFORM pg_notify('nq_status_outbox', '');
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER nq_queue_status_outbox
AFTER UPDATE ON nq_queue
FOR EACH ROW
WHEN (NEW.source = 'kubernetes' AND (
      OLD.status IS DISTINCT FROM NEW.status
   OR OLD.attempt_count IS DISTINCT FROM NEW.attempt_count
   OR OLD.last_error IS DISTINCT FROM NEW.last_error
   OR OLD.next_attempt_at IS DISTINCT FROM NEW.next_attempt_at))
EXECUTE FUNCTION nq_status_outbox_capture();
CREATE TRIGGER nq_queue_status_outbox_insert
AFTER INSERT ON nq_queue
FOR EACH ROW WHEN (NEW.source = 'kubernetes')
EXECUTE FUNCTION nq_status_outbox_capture();

-- Retry (the only way out of a final state): FAILED or DEAD_LETTERED rows move from the log back
-- to the queue, PENDING with a fresh set of attempts and the retry recorded on the row. A row
-- another retry moved first is no longer in the log (its DELETE waited for that one's lock and
-- then found nothing), so each row is retried once.
CREATE FUNCTION nq_delivery_log_retry(p_ids uuid[]) RETURNS SETOF nq_queue
LANGUAGE sql VOLATILE AS $$
    WITH moved AS (
        DELETE FROM nq_delivery_log
        WHERE id = ANY(p_ids) AND status IN ('FAILED', 'DEAD_LETTERED')
        RETURNING *
    )
    INSERT INTO nq_queue
    SELECT id, idempotency_key, request_hash, channel, recipient, subject, body, priority,
           'PENDING', send_at, now(), expires_at, 0, max_attempts, NULL, sent_at,
           provider_message_id, NULL, NULL,
           retries || jsonb_build_array(jsonb_build_object(
               'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
               'fromStatus', status)),
           source, policy, webhook_url, metadata, created_at, now(), NULL, recipient_id, category,
           template_name, template_version, provider, delivery_attempts
    FROM moved
    RETURNING *
$$;
