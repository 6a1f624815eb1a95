-- Digests (docs/digests.md has the states, the lock order and the races handled). An expand step:
-- 0.1.0 never reads nq_digests, never writes nq_jobs.digest_id (0012 added it), and calls none of
-- the functions defined or replaced here. The enqueue function's rules and body learn `digest`
-- where they are defined, in 0016 (unshipped, one definition in this release); the functions they
-- call for it are here.
--
-- A digest is a row of nq_digests: the recipient's open collection for one key on one channel.
-- Its items are ordinary notifications (nq_jobs rows with digest_id). One of them, the carrier,
-- is claimed when the digest closes and sends the digest as one message; the others are parked
-- (due a day after the window, never sent on their own) and end with the carrier's result.
--
-- Keyed (bucket, id) so that on Citus it is distributed by bucket and co-located with nq_jobs
-- (repositories/citus_layout.sql): a recipient's digests live on the shard of its notifications.
CREATE TABLE nq_digests (
    bucket smallint NOT NULL,
    id uuid NOT NULL,
    recipient text NOT NULL,
    channel text NOT NULL,
    key text NOT NULL,
    -- open: items join it; closed: its carrier was claimed (or maxItems joined), a create opens
    -- a new one; cancelled: every item left it while open, nothing is sent.
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

-- At most one open digest per recipient, channel and key: the arbiter of a create opening one
-- (nq_digest_join) and the lookup of one joining. Partial: closed digests leave it, so a create
-- after the close opens a new digest under the same key.
CREATE UNIQUE INDEX nq_digests_open ON nq_digests (bucket, recipient, channel, key)
    WHERE state = 'open';
-- Retention of closed digests (their items' log rows keep their id for `digest` answers).
CREATE INDEX nq_digests_closed ON nq_digests (closed_at) WHERE state <> 'open';

-- A digest's items in the queue (nq_jobs_digest, which the carrier's render and completion
-- read) are indexed by 0018, built concurrently outside a transaction.

-- One item joins its recipient's open digest for key and channel, or opens it (then it is the
-- carrier). The open digest row is locked (FOR UPDATE) until the caller's commit: a claim that
-- would close it skips it meanwhile (SKIP LOCKED), so when a claim closes a digest every item
-- that joined it has committed. A digest that a concurrent transaction closed is re-checked
-- after the wait and no longer found open: the item opens a new one, as it does when the open
-- digest's window has ended (it closes it on the way). Two creates opening the
-- same digest at once: the unique partial index lets one insert; the other loops and joins it.
-- The item that brings the count to maxItems closes the digest and makes its carrier due now
-- (lock order: the digest, then its items, as the cancel's; docs/digests.md).
CREATE FUNCTION nq_digest_join(
    p_bucket smallint, p_recipient text, p_channel text, p_key text, p_window_seconds integer,
    p_max_items integer, p_template text, p_item uuid,
    OUT digest_id uuid, OUT carrier boolean, OUT closed boolean, OUT closes_at timestamptz,
    OUT item_count integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    d nq_digests;
    -- The transaction's time, read once: a variable is a parameter to the statements below, so
    -- on Citus no now() sits inside the CASE of a distributed UPDATE (refused: "non-IMMUTABLE
    -- functions are not allowed in CASE or COALESCE"). now() is the transaction's start time on
    -- either engine, so plain PostgreSQL writes the same values.
    t timestamptz := now();
BEGIN
    LOOP
        SELECT x.* INTO d FROM nq_digests x
        WHERE x.bucket = p_bucket AND x.recipient = p_recipient AND x.channel = p_channel
          AND x.key = p_key AND x.state = 'open'
        FOR UPDATE;
        IF FOUND AND d.closes_at <= now() THEN
            -- Its window is over but no claim has closed it yet (workers busy or down): it
            -- closes now, at its window's end, and this item opens the next one. Its carrier is
            -- due already.
            UPDATE nq_digests x SET state = 'closed', closed_at = x.closes_at
            WHERE x.bucket = d.bucket AND x.id = d.id;
            CONTINUE;
        END IF;
        IF FOUND THEN
            UPDATE nq_digests x
            SET item_count = x.item_count + 1,
                state = CASE WHEN x.item_count + 1 >= x.max_items THEN 'closed' ELSE 'open' END,
                closed_at = CASE WHEN x.item_count + 1 >= x.max_items THEN t END
            WHERE x.bucket = d.bucket AND x.id = d.id
            RETURNING x.id, x.state = 'closed', x.closes_at, x.item_count
            INTO digest_id, closed, closes_at, item_count;
            carrier := false;
            IF closed THEN
                UPDATE nq_jobs j
                SET next_attempt_at = now(), waiting_reason = NULL, waiting_until = NULL,
                    waiting_detail = NULL, updated_at = now()
                WHERE j.bucket = d.bucket AND j.id = d.carrier_id AND j.status = 'PENDING';
            END IF;
            RETURN;
        END IF;
        INSERT INTO nq_digests AS x (bucket, id, recipient, channel, key, closes_at, max_items,
                                     item_count, template, carrier_id)
        VALUES (p_bucket, gen_random_uuid(), p_recipient, p_channel, p_key,
                now() + make_interval(secs => p_window_seconds), p_max_items, 1, p_template,
                p_item)
        ON CONFLICT (bucket, recipient, channel, key) WHERE state = 'open' DO NOTHING
        RETURNING x.id, x.closes_at INTO digest_id, closes_at;
        IF FOUND THEN
            carrier := true;
            closed := false;
            item_count := 1;
            RETURN;
        END IF;
    END LOOP;
END $$;

-- pydantic's StrictInt with ge/le, as the API words it (services.validation.DigestRequest).
CREATE FUNCTION nq_digest_int_error(v jsonb, lo integer, hi integer) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE
    WHEN jsonb_typeof(v) IS DISTINCT FROM 'number' OR v::text !~ '^-?[0-9]+$'
        THEN 'Input should be a valid integer'
    WHEN v::text::numeric < lo THEN 'Input should be greater than or equal to ' || lo
    WHEN v::text::numeric > hi THEN 'Input should be less than or equal to ' || hi
END;

-- The insert path of the API and of notify_queue_enqueue (0016, nq_insert_notifications) with
-- `digest`: the same arguments and result. Items with digest_key join their digest (`joined`);
-- the others are inserted exactly as there. A function of its own, called only for a batch with
-- a digest item (repositories/notifications.py, notify_queue_enqueue): a plain batch keeps 0016's
-- statement, which PostgreSQL plans on every call of a SQL function, so the digest steps cost
-- it nothing, not even planning.
CREATE FUNCTION nq_insert_digest_items(
    p_items json, p_default_max_attempts integer, p_default_webhook_url text
) RETURNS TABLE (
    id uuid, idempotency_key text, request_hash text, channel text, recipient text,
    subject text, body text, priority smallint, status text, send_at timestamptz,
    next_attempt_at timestamptz, expires_at timestamptz, attempt_count integer,
    max_attempts integer, last_error text, sent_at timestamptz, provider_message_id text,
    retries jsonb, source text, policy text, webhook_url text, metadata jsonb,
    created_at timestamptz, updated_at timestamptz, finished_at timestamptz,
    recipient_id text, category text, template_name text, template_version integer,
    provider text, delivery_attempts jsonb, bucket smallint, waiting_reason text,
    waiting_until timestamptz, waiting_detail text, digest_id uuid, escalation_id uuid,
    traceparent text)
LANGUAGE sql VOLATILE AS $$
WITH request AS (
    SELECT * FROM json_to_recordset(p_items) AS r(
        id uuid, idempotency_key text, request_hash text, channel text, recipient text,
        subject text, body text, priority smallint, send_at timestamptz, expires_at timestamptz,
        source text, policy text, webhook_url text, metadata jsonb, status text, last_error text,
        category text, recipient_id text, template_name text, template_version integer,
        traceparent text, position bigint, digest_key text, digest_window_seconds integer,
        digest_max_items integer, digest_template text)
), keys AS (
    INSERT INTO nq_idempotency_keys (key, notification_id, request_hash)
    SELECT r.idempotency_key, r.id, r.request_hash FROM request r ORDER BY r.position
    ON CONFLICT (key) DO NOTHING
    RETURNING notification_id
), accepted AS (
    SELECT r.id, r.idempotency_key, r.request_hash, r.channel, r.recipient, r.subject, r.body,
           r.priority, r.status, r.send_at, r.send_at AS next_attempt_at, r.expires_at,
           COALESCE(p.max_attempts, p_default_max_attempts) AS max_attempts, r.source,
           r.policy, r.webhook_url, r.metadata, r.last_error,
           CASE WHEN r.status <> 'PENDING' THEN now() END AS finished_at, r.category,
           r.recipient_id, r.template_name, r.template_version,
           nq_bucket(COALESCE(r.recipient_id, r.recipient)) AS bucket, r.traceparent,
           r.position, r.digest_key, r.digest_window_seconds, r.digest_max_items, r.digest_template
    FROM request r
    JOIN keys k ON k.notification_id = r.id
    LEFT JOIN nq_policies p ON p.name = r.policy
), joined AS (
    -- Digests (0019, docs/digests.md): each item joins its recipient's open digest for the key
    -- and channel, or opens one, in the batch's order (nq_digest_join locks the digest row, so
    -- creates in other processes and the claim that closes it are serialised on it). A plain
    -- notification has no digest_key: no row here, no digest read.
    SELECT a.id, j.digest_id, j.carrier, j.closes_at, j.item_count,
           bool_or(j.closed) OVER (PARTITION BY j.digest_id) AS closed
    FROM (SELECT * FROM accepted WHERE digest_key IS NOT NULL AND status = 'PENDING'
          ORDER BY position) a
    CROSS JOIN LATERAL nq_digest_join(a.bucket, a.recipient, a.channel, a.digest_key,
                                      a.digest_window_seconds, a.digest_max_items,
                                      a.digest_template, a.id) j
), queued AS (
    INSERT INTO nq_jobs AS n (
        id, idempotency_key, request_hash, channel, recipient, subject, body, priority, status,
        send_at, next_attempt_at, expires_at, max_attempts, source, policy, webhook_url,
        metadata, last_error, finished_at, category, recipient_id, template_name,
        template_version, bucket, traceparent, waiting_reason, waiting_until, waiting_detail,
        digest_id)
    SELECT a.id, a.idempotency_key, a.request_hash, a.channel, a.recipient, a.subject, a.body,
           a.priority, a.status, a.send_at,
           -- A digest's carrier is due when the digest closes (now, when this batch filled it);
           -- its other items are parked a day past that: the carrier sends them (0019).
           CASE WHEN j.id IS NULL THEN a.next_attempt_at
                WHEN j.carrier AND j.closed THEN now()
                WHEN j.carrier THEN j.closes_at
                ELSE j.closes_at + interval '1 day' END,
           a.expires_at, a.max_attempts,
           a.source, a.policy, a.webhook_url, a.metadata, a.last_error, a.finished_at,
           a.category, a.recipient_id, a.template_name, a.template_version, a.bucket,
           a.traceparent,
           CASE WHEN j.id IS NOT NULL AND j.carrier AND j.closed THEN NULL
                WHEN j.id IS NOT NULL THEN 'DigestWindow'
                WHEN a.send_at > now() THEN 'Scheduled' END,
           CASE WHEN j.id IS NOT NULL AND j.closed THEN NULL
                WHEN j.id IS NOT NULL THEN j.closes_at
                WHEN a.send_at > now() THEN a.send_at END,
           CASE WHEN j.id IS NOT NULL AND j.carrier AND j.closed THEN NULL
                WHEN j.id IS NOT NULL AND j.closed THEN 'sent with its digest ' || a.digest_key
                                                        || ', which is closed'
                WHEN j.id IS NOT NULL THEN 'digest ' || a.digest_key || ' collects until '
                                           || nq_rfc3339(j.closes_at) || ' or '
                                           || a.digest_max_items || ' items'
                WHEN a.send_at > now() THEN 'sendAt is in the future' END,
           j.digest_id
    FROM accepted a LEFT JOIN joined j ON j.id = a.id WHERE a.status = 'PENDING'
    RETURNING n.id, n.idempotency_key, n.request_hash, n.channel, n.recipient, n.subject,
              n.body, n.priority, n.status, n.send_at, n.next_attempt_at, n.expires_at,
              n.attempt_count, n.max_attempts, n.last_error, n.sent_at, n.provider_message_id,
              n.retries, n.source, n.policy, n.webhook_url, n.metadata, n.created_at,
              n.updated_at, n.finished_at, n.recipient_id, n.category, n.template_name,
              n.template_version, n.provider, n.delivery_attempts, n.bucket, n.waiting_reason,
              n.waiting_until, n.waiting_detail, n.digest_id, n.escalation_id, n.traceparent
), logged AS (
    INSERT INTO nq_delivery_log AS l (
        id, idempotency_key, request_hash, channel, recipient, subject, body, priority, status,
        send_at, next_attempt_at, expires_at, max_attempts, source, policy, webhook_url,
        metadata, last_error, finished_at, category, recipient_id, template_name,
        template_version, bucket, traceparent)
    SELECT a.id, a.idempotency_key, a.request_hash, a.channel, a.recipient, a.subject, a.body,
           a.priority, a.status, a.send_at, a.next_attempt_at, a.expires_at, a.max_attempts,
           a.source, a.policy, a.webhook_url, a.metadata, a.last_error, a.finished_at,
           a.category, a.recipient_id, a.template_name, a.template_version, a.bucket,
           a.traceparent
    FROM accepted a WHERE a.status <> 'PENDING'
    RETURNING l.id, l.idempotency_key, l.request_hash, l.channel, l.recipient, l.subject,
              l.body, l.priority, l.status, l.send_at, l.next_attempt_at, l.expires_at,
              l.attempt_count, l.max_attempts, l.last_error, l.sent_at, l.provider_message_id,
              l.retries, l.source, l.policy, l.webhook_url, l.metadata, l.created_at,
              l.updated_at, l.finished_at, l.recipient_id, l.category, l.template_name,
              l.template_version, l.provider, l.delivery_attempts, l.bucket,
              NULL::text AS waiting_reason, NULL::timestamptz AS waiting_until,
              NULL::text AS waiting_detail, l.digest_id, l.escalation_id, l.traceparent
), events AS (
    SELECT nq_insert_webhook_events(array_agg(g.id), array_agg(g.status),
                                    array_agg(g.attempt_count), array_agg(g.webhook_url),
                                    array_agg(g.policy), p_default_webhook_url,
                                    NULL::text[], array_agg(g.bucket)) AS n
    FROM logged g
), counted AS (
    SELECT nq_note_changes(array_agg(g.id), array_agg(g.source), NULL, array_agg(g.status)) AS n
    FROM logged g
)
-- events and counted are read (once, as init plans) so that they run.
SELECT i.* FROM (SELECT * FROM queued UNION ALL SELECT * FROM logged) i
WHERE (SELECT n FROM events) IS NOT DISTINCT FROM (SELECT n FROM events)
  AND (SELECT n FROM counted) IS NOT DISTINCT FROM (SELECT n FROM counted)
$$;

-- `digest` of a notification's answer: {key, id, count} of its digest, by primary key. A function
-- of its own with a quoted body: Citus sends a statement that reads a distributed table to the
-- shard's node, and it deparses a SQL-standard body (`RETURN ...`) as a statement the node
-- cannot parse ("syntax error at or near RETURN"), so nq_notification_json, whose body is
-- `RETURN`, reads no table itself (docs/scaling.md).
CREATE FUNCTION nq_digest_ref(p_bucket smallint, p_id uuid) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('key', d.key, 'id', d.id, 'count', d.item_count)
    FROM nq_digests d WHERE d.bucket = p_bucket AND d.id = p_id
$$;

-- A notification as the API answers it (0017), with `digest`: {key, id, count} of its digest,
-- read by primary key only for a notification that has one.
CREATE OR REPLACE FUNCTION nq_notification_json(n nq_all_notifications) RETURNS jsonb
LANGUAGE sql STABLE
RETURN jsonb_build_object(
    'id', n.id, 'idempotencyKey', n.idempotency_key, 'channel', n.channel,
    'recipient', n.recipient, 'subject', n.subject, 'body', n.body,
    'priority', (ARRAY['HIGH', 'NORMAL', 'LOW'])[n.priority + 1], 'status', n.status,
    'sendAt', nq_rfc3339(n.send_at), 'nextAttemptAt', nq_rfc3339(n.next_attempt_at),
    'waiting', CASE WHEN n.status = 'PENDING' AND n.waiting_reason IS NOT NULL
                         AND (n.waiting_until IS NULL OR n.waiting_until > now())
                    THEN jsonb_build_object('reason', n.waiting_reason,
                                            'until', nq_rfc3339(n.waiting_until),
                                            'detail', COALESCE(n.waiting_detail, n.waiting_reason))
               END,
    'expiresAt', nq_rfc3339(n.expires_at), 'attemptCount', n.attempt_count,
    'maxAttempts', n.max_attempts, 'lastError', n.last_error, 'sentAt', nq_rfc3339(n.sent_at),
    'providerMessageId', n.provider_message_id, 'provider', n.provider,
    'deliveryAttempts', n.delivery_attempts, 'retries', n.retries, 'source', n.source,
    'metadata', n.metadata, 'createdAt', nq_rfc3339(n.created_at),
    'updatedAt', nq_rfc3339(n.updated_at), 'category', n.category,
    'recipientId', n.recipient_id,
    'template', CASE WHEN n.template_name IS NULL THEN NULL
                     ELSE jsonb_build_object('name', n.template_name,
                                             'version', n.template_version) END,
    'digest', CASE WHEN n.digest_id IS NULL THEN NULL
                   ELSE nq_digest_ref(n.bucket, n.digest_id) END);
