-- 0.1.0's schema, its eight steps in one (docs/upgrading.md, "The history squashed"): what a
-- new installation starts from, recorded in nq_schema_migrations as version 8, where 0.1.0's
-- readiness looks. A database of 0.1.0 recorded 0001-0008 and has all of it. Every table is
-- prefixed nq_ so the schema can share a database with an application. The design and its
-- reasons are in docs/design.md ("The queue and the delivery log"): nq_queue holds the
-- unfinished notifications (0.2.0 renames it nq_jobs), nq_delivery_log the finished ones,
-- partitioned by day, nq_idempotency_keys every key, nq_notifications is a view over both.
-- The log's partitions are made by nq_delivery_log_prepare, defined at the start of this step:
-- functions: nq_delivery_log_prepare

-- Rolling-window rate limits: one slot per delivery taken, kept while it counts.
-- A slot is taken when a notification is claimed (so two workers cannot both take the last one)
-- and given back in the completion transaction when the attempt did not deliver.
CREATE TABLE nq_rate_slots (
    notification_id uuid PRIMARY KEY,
    recipient       text NOT NULL,
    taken_at        timestamptz NOT NULL
);
-- Counting a recipient's slots in the window, and finding when the oldest one frees.
CREATE INDEX nq_rate_slots_recipient ON nq_rate_slots (recipient, taken_at);
-- Pruning slots older than every window.
CREATE INDEX nq_rate_slots_taken ON nq_rate_slots (taken_at);

-- Delivery policies (mirrored from NotificationPolicy resources; name is namespace/name).
-- NULL columns fall back to the worker's defaults.
CREATE TABLE nq_policies (
    name                       text PRIMARY KEY,
    rate_limit                 integer CHECK (rate_limit > 0),
    rate_window_seconds        double precision CHECK (rate_window_seconds > 0),
    max_attempts               integer CHECK (max_attempts > 0),
    backoff_base_seconds       double precision CHECK (backoff_base_seconds > 0),
    backoff_max_seconds        double precision CHECK (backoff_max_seconds > 0),
    webhook_url                text,
    webhook_secrets            text[] NOT NULL DEFAULT '{}',
    ttl_seconds_after_finished integer CHECK (ttl_seconds_after_finished >= 0),
    updated_at                 timestamptz NOT NULL DEFAULT now()
);

-- The webhook outbox: written in the same transaction as the status change it reports, then
-- dispatched by workers (at least once, same id every time).
CREATE TABLE nq_webhook_events (
    id               uuid PRIMARY KEY,
    notification_id  uuid NOT NULL,
    url              text NOT NULL,
    -- The policy whose secrets sign the event, read at dispatch time so a rotation applies at once;
    -- NULL signs with the worker's --webhook-secret.
    policy           text,
    payload          text NOT NULL,
    state            text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    claim_token      uuid,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz
);
-- Dispatch index: only pending events, in due order (a dispatcher's lease is a future next_attempt_at).
CREATE INDEX nq_webhook_events_due ON nq_webhook_events (next_attempt_at) WHERE state = 'pending';
CREATE INDEX nq_webhook_events_notification ON nq_webhook_events (notification_id);

-- The Kubernetes operator's tables: which object each mirrored notification belongs to, and the
-- status outbox that carries every change of those notifications back to the objects.

-- One row per Notification object that became a notification row: the object's uid (unique in
-- time and space; a re-created object with the same name has another uid), where it lives, and
-- the row it became. Several objects may link to one row (the same explicit idempotencyKey and
-- the same request); a row links to no object when it came from the HTTP API.
CREATE TABLE nq_kube_links (
    uid                     text PRIMARY KEY,
    namespace               text NOT NULL,
    name                    text NOT NULL,
    notification_id         uuid NOT NULL,
    -- metadata.generation when mirrored; reported as status.observedGeneration.
    generation              bigint NOT NULL DEFAULT 1,
    created_at              timestamptz NOT NULL DEFAULT now(),
    -- When the TTL sweeper last asked Kubernetes to delete the object (so the next sweep does
    -- not ask again at once); the link itself goes when the object's finalizer runs.
    ttl_delete_requested_at timestamptz
);
-- The trigger below looks links up by notification for every change of a Kubernetes row.
CREATE INDEX nq_kube_links_notification ON nq_kube_links (notification_id);

-- The status outbox: one row per change of a linked notification (and per object linked to it),
-- consumed in seq order by the operator, which patches the object's .status and then deletes
-- the rows. It is a queue, not a log: it holds only what is not yet written back.
CREATE TABLE nq_status_outbox (
    seq             bigserial PRIMARY KEY,
    uid             text NOT NULL,
    namespace       text NOT NULL,
    name            text NOT NULL,
    notification_id uuid NOT NULL,
    -- The transition, so the operator can post an Event for each one worth an Event
    -- (dead-lettered, failed) even when it coalesces several changes into one patch.
    old_status      text,
    new_status      text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
-- A namespaced operator reads only its namespace's rows, in seq order.
CREATE INDEX nq_status_outbox_namespace ON nq_status_outbox (namespace, seq);

-- Counts of finished notifications and of relayed webhook events, kept as they change.
--
-- /status and every /metrics scrape used to count all history (count(*) GROUP BY status over
-- every notification ever sent), so a scrape's cost grew with the table. Final states are now
-- counted when rows enter or leave them; unfinished ones (PENDING, PROCESSING, pending events)
-- are few and counted from their partial indexes. A scrape then costs the same at 0 and at 10M
-- finished rows.
--
-- Written by statement-level triggers with transition tables: one upsert per status per
-- statement, not per row, so a completion batch of 500 rows adds at most one write per final
-- status it produced. Every path that changes a status (completion, lease recovery, expiry,
-- cancel, retry, anything added later) is counted without having to remember to.
--
-- `shard` spreads concurrent writers over rows: a counter row is locked from the upsert to the
-- commit of its transaction, so with one row per status every worker's completion would queue
-- behind every other's. With the backend's pid modulo 16, two transactions wait for each other
-- only when their connections share a shard. The reader sums the shards.
CREATE TABLE nq_counters (
    name  text     NOT NULL,  -- 'notifications:SENT', 'webhooks:delivered', ...
    shard smallint NOT NULL,
    n     bigint   NOT NULL,
    PRIMARY KEY (name, shard)
);

-- One function for both tables. TG_ARGV: the counters' prefix ('notifications', 'webhooks'),
-- the state column, and the states not counted, comma-separated (the unfinished ones: few, and
-- counted from their partial indexes instead). Each event reads only the transition tables it
-- has; rows are upserted in name order, so two statements never lock the same counters in
-- opposite orders. EXECUTE plans the small upsert once per statement, not per row.
CREATE FUNCTION nq_count_changes() RETURNS trigger
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

CREATE TRIGGER nq_webhook_events_count_insert AFTER INSERT ON nq_webhook_events
    REFERENCING NEW TABLE AS nq_new FOR EACH STATEMENT EXECUTE FUNCTION nq_count_changes('webhooks', 'state', 'pending');
CREATE TRIGGER nq_webhook_events_count_update AFTER UPDATE ON nq_webhook_events
    REFERENCING OLD TABLE AS nq_old NEW TABLE AS nq_new
    FOR EACH STATEMENT EXECUTE FUNCTION nq_count_changes('webhooks', 'state', 'pending');
CREATE TRIGGER nq_webhook_events_count_delete AFTER DELETE ON nq_webhook_events
    REFERENCING OLD TABLE AS nq_old FOR EACH STATEMENT EXECUTE FUNCTION nq_count_changes('webhooks', 'state', 'pending');
CREATE TRIGGER nq_webhook_events_count_truncate AFTER TRUNCATE ON nq_webhook_events
    FOR EACH STATEMENT EXECUTE FUNCTION nq_count_changes('webhooks', 'state', 'pending');

-- Recipients, their preferences, templates, and the SUPPRESSED state (docs/recipients.md).

-- A recipient: contacts per channel, a timezone and preferences. Preferences are columns, not a
-- jsonb document: the claim reads them for every user-targeted notification it takes (one
-- primary-key lookup per row), and typed columns keep that read cheap and the rules checkable.
CREATE TABLE nq_recipients (
    -- Chosen by the client (e.g. the application's user id).
    id                 text PRIMARY KEY,
    email              text,
    phone              text,
    -- A push goes to the first token (the client lists the current device first).
    push_tokens        text[] NOT NULL DEFAULT '{}',
    -- An IANA zone name, checked with zoneinfo by the API; quiet hours are read in it.
    timezone           text NOT NULL DEFAULT 'UTC',
    opt_out_all        boolean NOT NULL DEFAULT false,
    opt_out_channels   text[] NOT NULL DEFAULT '{}',
    opt_out_categories text[] NOT NULL DEFAULT '{}',
    -- Local wall-clock times; start > end is a window across midnight. Both or neither.
    quiet_start        time,
    quiet_end          time,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CHECK ((quiet_start IS NULL) = (quiet_end IS NULL))
);
-- No index beyond the primary key: every read is by id (API, expansion, claim).

-- Templates: per-channel subject and body, rendered at creation (never at send time), so a
-- notification keeps the text of the version it was made from.
CREATE TABLE nq_templates (
    name        text PRIMARY KEY,
    -- {"email": {"subject", "body"}, "sms": {"body"}, "push": {"subject", "body"}}
    channels    jsonb NOT NULL,
    -- Incremented by every change of channels; a PUT of the same content keeps it.
    version     integer NOT NULL DEFAULT 1,
    -- 'api' or 'kubernetes' (mirrored from a NotificationTemplate).
    source      text NOT NULL DEFAULT 'api',
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- NotificationPolicy readiness (docs/operator.md): policies fail closed.
--
-- The operator mirrors every NotificationPolicy, including one whose webhook Secret is missing
-- or whose spec cannot be used; such a row has ready = false, and workers hold the
-- notifications that name it (claim_admit_candidates defers them without using an attempt)
-- instead of sending them under the defaults. A notification whose policy has no row at all
-- (no NotificationPolicy of that name exists) still uses the defaults, as before.
-- DEFAULT true: rows mirrored before this migration were mirrored because they were usable.
ALTER TABLE nq_policies ADD COLUMN ready boolean NOT NULL DEFAULT true;

-- Named providers with chains, shared send-rate limits, circuit breakers and failover.
-- The design and its reasons are in docs/design.md ("Providers").

-- A provider's send schedule, shared by every worker: the next moment a send may start (GCRA,
-- the "virtual scheduling" form of a token bucket). A worker reserves k consecutive send slots in
-- one statement by moving next_free k steps (1 / perSecond each) ahead; slots of different
-- workers never overlap, so all workers together keep the provider's rate in every window,
-- not only on average. One row per rate-limited provider, created when a worker starts.
CREATE TABLE nq_provider_schedule (
    provider  text PRIMARY KEY,
    next_free timestamptz NOT NULL
);

-- A circuit breaker per provider, shared by every worker.
--   closed:    calls flow; `failures` counts the current run of failures (a success resets it);
--              at the threshold the circuit opens.
--   open:      no calls until `open_until`; notifications fail over or wait without an attempt.
--   half-open: one worker holds the probe (`probe_token`, until `probe_until`, after which a
--              lost probe may be taken again); its result closes the circuit or opens it again.
CREATE TABLE nq_provider_circuits (
    provider    text PRIMARY KEY,
    state       text NOT NULL DEFAULT 'closed' CHECK (state IN ('closed', 'open', 'half-open')),
    failures    integer NOT NULL DEFAULT 0,
    open_until  timestamptz,
    probe_token uuid,
    probe_until timestamptz,
    changed_at  timestamptz NOT NULL DEFAULT now()
);

-- A policy may pin the failover rule and the chain of providers its notifications use.
ALTER TABLE nq_policies
    ADD COLUMN failover text CHECK (failover IN ('Never', 'OnDefiniteFailure', 'Always')),
    ADD COLUMN providers text[];

-- Webhook events carry the provider that sent (or last tried) the notification. The older
-- signature exists only where 0.1.0's 0002 made it.
DROP FUNCTION IF EXISTS nq_insert_webhook_events(uuid[], text[], integer[], text[], text[], text);
CREATE FUNCTION nq_insert_webhook_events(
    p_ids uuid[], p_statuses text[], p_attempts integer[], p_urls text[], p_policies text[],
    p_default_url text, p_providers text[] DEFAULT NULL
) RETURNS integer
LANGUAGE sql VOLATILE AS $$
    WITH changed AS (
        SELECT gen_random_uuid() AS event_id, c.id, c.status, c.attempts, c.provider,
               COALESCE(c.url, p.webhook_url, p_default_url) AS url,
               p.name AS policy
        -- A multi-argument unnest pads shorter arrays with NULLs: callers without providers
        -- (expiry, lease recovery) pass none.
        FROM unnest(p_ids, p_statuses, p_attempts, p_urls, p_policies, p_providers)
             AS c(id, status, attempts, url, policy, provider)
        LEFT JOIN nq_policies p ON p.name = c.policy
        WHERE c.status IN ('SENT', 'FAILED', 'DEAD_LETTERED', 'EXPIRED', 'SUPPRESSED')
    ), inserted AS (
        INSERT INTO nq_webhook_events (id, notification_id, url, policy, payload)
        SELECT c.event_id, c.id, c.url, c.policy,
               json_build_object(
                   'eventId', c.event_id,
                   'jobId', c.id,
                   'status', c.status,
                   'attemptCount', c.attempts,
                   'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                   'provider', c.provider
               )::text
        FROM changed c
        WHERE c.url IS NOT NULL
        RETURNING 1
    )
    SELECT count(*)::integer FROM inserted
$$;

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
