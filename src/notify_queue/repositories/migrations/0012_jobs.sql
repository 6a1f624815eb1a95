-- The queue for every engine, expand half. docs/design.md ("The queue's
-- tables") and docs/upgrading.md ("0.1.0 to 0.2.0") have the reasons; in short:
--
-- 1. The unfinished notifications gain columns: `bucket` (the recipient's bucket, the
--    distribution column on Citus, docs/scaling.md), the reason a row waits (`waiting_*`, written
--    by the statement that defers it), its digest and escalation, and its trace context. 0.1.0
--    reads nq_queue with `RETURNING *` in server-prepared statements, which a new column breaks
--    ("cached plan must not change result type"), so the table is renamed to nq_jobs and
--    nq_queue becomes a view of exactly 0.1.0's columns, through which 0.1.0's statements read
--    and write the same rows (a simple view is updatable, FOR UPDATE locks the table's rows).
--    The delivery log gains the columns a finished row keeps; 0.1.0 never reads it with `*`.
-- 2. 0.2.0 writes every consequence of a status change in the statement that makes it: the move
--    of a finished row into the log (nq_finish), the counters and the Kubernetes status outbox
--    (nq_note_changes). Citus refuses triggers on distributed tables, and a trigger with
--    transition tables costs every statement that fires it. The triggers stay for 0.1.0's
--    statements until the contract step: each one now does nothing in a session of 0.2.0 or
--    later (nq_explicit_session), which does the same work itself.
-- 3. The rolling rate-limit window is one row per recipient (nq_rate_windows) instead of one slot
--    row per delivery (nq_rate_slots, 0.1.0's, dropped by the contract step): an update of a row
--    no btree index covers changes is HOT.
--
-- The functions 0.2.0 calls are source code (functions/); the ones this step's backfill and the
-- kept triggers call are defined by `migrate` at its start (the header below). The functions
-- defined here serve 0.1.0's triggers and view only, until the contract step 0013 drops them
-- with those: they are history, not today's schema, so they stay in this step.
-- functions: nq_bucket, nq_count, nq_note_changes, nq_delivery_log_ready, nq_insert_webhook_events

-- True in a session of 0.2.0 or later (application_name `<role>@<release>`, repositories/db.py):
-- such a session writes the consequences of its changes itself, so the triggers kept for 0.1.0
-- must not write them twice. Any other session (0.1.0, psql) keeps the triggers' behaviour, but
-- for a transaction that set `nq.explicit` (0.1.0's entry into nq_retry, below).
CREATE FUNCTION nq_explicit_session() RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
RETURN current_setting('application_name') ~ '^notify-queue-[a-z-]+@[0-9]'
    OR current_setting('nq.explicit', true) = 'on';

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

-- The queue is all churn: every row is inserted, updated and deleted within minutes, and a burst
-- through the API can grow it from nothing to 100,000 rows in seconds. Autovacuum's defaults
-- (analyse after 10% of the table changed, vacuum after 20%) leave it planned on the statistics
-- of an empty table long after the burst arrived, and dead rows piling up in the claim index's
-- head. Per-table settings: analyse and vacuum after a few hundred changes or 2%, whichever is
-- larger, so the statistics follow the backlog within autovacuum's naptime.
ALTER TABLE nq_jobs SET (
    autovacuum_analyze_threshold = 500, autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_threshold = 1000, autovacuum_vacuum_insert_scale_factor = 0.02);

-- The backlog's buckets (the log's old rows keep none: nothing reads a finished row's bucket on
-- a single server, and a move onto Citus recomputes them, docs/scaling.md). Rows 0.1.0 inserts
-- through the view get theirs from the trigger below.
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

-- The triggers 0.1.0 relies on, now silent in sessions that write the same work themselves.
-- The move names its columns (the log has more than 0.1.0's view now).
CREATE OR REPLACE FUNCTION nq_queue_move_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    finished uuid[];
BEGIN
    IF nq_explicit_session() THEN
        RETURN NULL;
    END IF;
    finished := ARRAY(SELECT id FROM nq_new WHERE status NOT IN ('PENDING', 'PROCESSING'));
    IF cardinality(finished) = 0 THEN
        RETURN NULL;
    END IF;
    -- The UPDATE set the final values; 0.1.0's statement wrote the webhook event, and the log's
    -- and this table's triggers count it and queue its status write: only the move is left.
    PERFORM nq_finish(finished, NULL, NULL, NULL, NULL, NULL, NULL, NULL, false);
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION nq_count_changes() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    prefix    text := TG_ARGV[0];
    state     text := quote_ident(TG_ARGV[1]);
    uncounted text[] := string_to_array(TG_ARGV[2], ',');
    changes   text;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        DELETE FROM nq_counters WHERE starts_with(name, prefix || ':');
        RETURN NULL;
    END IF;
    IF nq_explicit_session() THEN
        RETURN NULL;
    END IF;
    changes := CASE TG_OP
        WHEN 'INSERT' THEN 'SELECT ' || state || ', 1 FROM nq_new'
        WHEN 'DELETE' THEN 'SELECT ' || state || ', -1 FROM nq_old'
        ELSE 'SELECT ' || state || ', 1 FROM nq_new UNION ALL SELECT ' || state || ', -1 FROM nq_old'
    END;
    EXECUTE
        'INSERT INTO nq_counters AS c (name, shard, n)'
        || ' SELECT $1 || '':'' || s, mod(pg_backend_pid(), 16), sum(d)'
        || ' FROM (' || changes || ') AS x(s, d) WHERE s <> ALL($2)'
        || ' GROUP BY s HAVING sum(d) <> 0 ORDER BY 1'
        || ' ON CONFLICT (name, shard) DO UPDATE SET n = c.n + excluded.n'
        USING prefix, uncounted;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION nq_status_outbox_capture() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF nq_explicit_session() THEN
        RETURN NULL;
    END IF;
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

-- nq_attempts_append: source code now, functions/nq_attempts_append.sql.

-- Webhook events carry their notification's bucket: on Citus they are distributed by it,
-- co-located with the queue and the log, so the relay's claim (FOR UPDATE SKIP LOCKED) names one
-- bucket (docs/scaling.md). A new nullable column: 0.1.0 inserts events without it and never
-- reads webhook events with `*`; `migrate` on a Citus coordinator fills the missing ones
-- (citus_layout.sql) before it distributes the table.
ALTER TABLE nq_webhook_events ADD COLUMN bucket smallint;

-- The one way a notification becomes final: its row leaves the queue and enters the log in one
-- statement (the DELETE's lock and the INSERT commit together), with its counters, its status
-- write for the operator and, for the states that have one, its webhook event. The caller has
-- locked the rows (FOR UPDATE, with its own conditions: the claim token, PENDING for a cancel) in
-- the same statement or transaction, so nothing else can change them in between. Each array
-- gives one value per id; a NULL array keeps the row's own value (0.1.0's move trigger passes
-- none: its UPDATE already set them, and with p_note false: its triggers note the change).
-- Returns the rows as logged, for the caller's answer.
CREATE FUNCTION nq_finish(
    p_ids uuid[], p_statuses text[], p_last_errors text[], p_attempt_counts integer[],
    p_provider_message_ids text[], p_providers text[], p_delivery_attempts jsonb[],
    p_default_webhook_url text, p_note boolean DEFAULT true
) RETURNS TABLE (id uuid, status text, attempt_count integer, source text, channel text,
                 recipient text, recipient_id text, bucket smallint, webhook_url text,
                 policy text, provider text)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    PERFORM nq_delivery_log_ready();
    RETURN QUERY
    WITH given AS (
        SELECT * FROM unnest(p_ids, p_statuses, p_last_errors, p_attempt_counts,
                             p_provider_message_ids, p_providers, p_delivery_attempts)
            AS g(id, status, last_error, attempt_count, provider_message_id, provider,
                 delivery_attempts)
    ), moved AS (
        DELETE FROM nq_jobs j USING given g
        WHERE j.id = ANY(p_ids) AND j.id = g.id
        RETURNING j.*, j.status AS old_status,
                  COALESCE(g.status, j.status) AS final_status,
                  CASE WHEN p_last_errors IS NULL THEN j.last_error ELSE g.last_error END
                      AS final_last_error,
                  COALESCE(g.attempt_count, j.attempt_count) AS final_attempt_count,
                  CASE WHEN p_provider_message_ids IS NULL THEN j.provider_message_id
                       ELSE g.provider_message_id END AS final_provider_message_id,
                  CASE WHEN p_providers IS NULL THEN j.provider ELSE g.provider END
                      AS final_provider,
                  COALESCE(g.delivery_attempts, j.delivery_attempts) AS final_delivery_attempts
    ), logged AS (
        INSERT INTO nq_delivery_log (
            id, idempotency_key, request_hash, channel, recipient, subject, body, priority,
            status, send_at, next_attempt_at, expires_at, attempt_count, max_attempts,
            last_error, sent_at, provider_message_id, claim_token, lease_expires_at, retries,
            source, policy, webhook_url, metadata, created_at, updated_at, finished_at,
            recipient_id, category, template_name, template_version, provider,
            delivery_attempts, bucket, digest_id, escalation_id, traceparent)
        SELECT m.id, m.idempotency_key, m.request_hash, m.channel, m.recipient, m.subject, m.body,
               m.priority, m.final_status, m.send_at, m.next_attempt_at, m.expires_at,
               m.final_attempt_count, m.max_attempts, m.final_last_error,
               CASE WHEN m.final_status = 'SENT' THEN COALESCE(m.sent_at, now()) ELSE m.sent_at END,
               m.final_provider_message_id, NULL, NULL, m.retries, m.source, m.policy,
               m.webhook_url, m.metadata, m.created_at, now(), COALESCE(m.finished_at, now()),
               m.recipient_id, m.category, m.template_name, m.template_version, m.final_provider,
               m.final_delivery_attempts, m.bucket, m.digest_id, m.escalation_id, m.traceparent
        FROM moved m
        RETURNING id, status, attempt_count, source, channel, recipient, recipient_id, bucket,
                  webhook_url, policy, provider
    ), noted AS (
        SELECT nq_note_changes(array_agg(m.id), array_agg(m.source), array_agg(m.old_status),
                               array_agg(m.final_status)) AS n
        FROM moved m WHERE p_note
    ), events AS (
        SELECT nq_insert_webhook_events(array_agg(l.id), array_agg(l.status),
                                        array_agg(l.attempt_count), array_agg(l.webhook_url),
                                        array_agg(l.policy), p_default_webhook_url,
                                        array_agg(l.provider), array_agg(l.bucket)) AS n
        FROM logged l WHERE p_note
    )
    -- noted and events are read so that they run (a SELECT in WITH runs only when referenced).
    SELECT l.id, l.status, l.attempt_count, l.source, l.channel, l.recipient, l.recipient_id,
           l.bucket, l.webhook_url, l.policy, l.provider
    FROM logged l
    WHERE (SELECT n FROM noted) IS NOT DISTINCT FROM (SELECT n FROM noted)
      AND (SELECT n FROM events) IS NOT DISTINCT FROM (SELECT n FROM events);
END $$;

-- The rolling window, one row per recipient: the deliveries it counts (notification and time,
-- oldest first) while any window in use can still count them. A claim appends, an attempt that
-- sent nothing takes its entry back, housekeeping deletes rows whose newest entry counts no more.
-- The key is (bucket, recipient) so the row lives beside the recipient's notifications on Citus.
-- Only the key has a btree index: the claim's update of `taken`/`last_taken_at` is HOT. The BRIN
-- on last_taken_at (a summarising index does not stop HOT) lets housekeeping find old rows
-- without a scan of recent ones.
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

-- 0.1.0's slots still in a window carry over, so the limit holds across the upgrade. While 0.1.0
-- workers run they count only their own slots (docs/upgrading.md: a recipient may get up to its
-- limit from each release during the roll-out).
INSERT INTO nq_rate_windows (bucket, recipient, ids, taken, last_taken_at)
SELECT nq_bucket(COALESCE(j.recipient_id, s.recipient)), s.recipient,
       array_agg(s.notification_id ORDER BY s.taken_at), array_agg(s.taken_at ORDER BY s.taken_at),
       max(s.taken_at)
FROM nq_rate_slots s LEFT JOIN nq_jobs j ON j.id = s.notification_id
GROUP BY 1, 2
ON CONFLICT (bucket, recipient) DO NOTHING;

-- The retry (0008, 0011) with named columns: 0.1.0 calls it by name and reads its rows with `*`,
-- so it keeps returning 0.1.0's columns (the view's row type); 0.2.0 calls nq_retry (below).
-- Why: recreated below with the same name, arguments and result for 0.1.0 (its row type is now
-- the view's); a function's result type cannot change in place.
-- squawk-ignore ban-drop-function
DROP FUNCTION nq_delivery_log_retry(uuid[]);
-- nq_retry: source code now, functions/nq_retry.sql.
CREATE FUNCTION nq_delivery_log_retry(p_ids uuid[]) RETURNS SETOF nq_queue
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    retried uuid[];
BEGIN
    -- nq_retry writes the counters and status writes itself: the triggers stay silent for the
    -- rest of this transaction, whose next statements in 0.1.0 change nothing.
    PERFORM set_config('nq.explicit', 'on', true);
    retried := ARRAY(SELECT nq_retry(p_ids));
    -- A statement of its own, so it sees the rows the retry inserted.
    RETURN QUERY SELECT * FROM nq_queue WHERE id = ANY(retried);
END $$;

-- Reads of 0.2.0: every notification, unfinished or finished, with the columns each has (the
-- claim token and lease only while it is claimed, the reason it waits only while it waits).
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

-- The rate windows' entries one per row (notification, recipient, when it took its place): for
-- people and tests reading the windows, not for the hot path.
CREATE VIEW nq_rate_window_entries AS
SELECT e.notification_id, w.bucket, w.recipient, e.taken_at
FROM nq_rate_windows w, unnest(w.ids, w.taken) AS e(notification_id, taken_at);
