-- Digests (CONTRACT section 10, issue 22; docs/digests.md has the states, the lock order and the
-- races handled). An expand step: 0.1.0 never reads nq_digests, never writes nq_jobs.digest_id
-- (0012 added it), and calls none of the functions replaced here.
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

-- A digest's items in the queue: the carrier's render and completion read them through this.
-- Partial on digest_id: a plain notification writes no entry, so creates and claims that never
-- use digests pay nothing for it.
-- Why: CONCURRENTLY cannot run in the migrator's transaction; nq_jobs holds only the unfinished
-- notifications (the backlog, not the history), and the predicate matches none of today's rows
-- (0.1.0 never sets digest_id), so the build is a read of the backlog, as 0017's index.
-- squawk-ignore require-concurrent-index-creation
CREATE INDEX nq_jobs_digest ON nq_jobs (bucket, digest_id) WHERE digest_id IS NOT NULL;

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
                closed_at = CASE WHEN x.item_count + 1 >= x.max_items THEN now() END
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
                                    array_agg(g.policy), p_default_webhook_url) AS n
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

-- The rules of 0016 with `digest` (services.validation.DigestRequest and the model's check).
CREATE OR REPLACE FUNCTION nq_enqueue_errors(p jsonb, p_key text) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    storable jsonb := '[]';
    keyed jsonb := '[]';
    missing jsonb := '[]';
    errs jsonb := '[]';
    crossed jsonb := '[]';
    late jsonb := '[]';
    v jsonb;
    t text;
    s text;
    n integer;
    channel_ok text;  -- the channel, when it is valid (the recipient's format depends on it)
    ws constant text := '[\s\x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]';
    allowed constant text[] := ARRAY['channel', 'recipient', 'subject', 'body', 'recipientId',
        'channels', 'strategy', 'category', 'template', 'data', 'priority', 'sendAt',
        'delaySeconds', 'expiresAt', 'webhookUrl', 'policy', 'metadata', 'idempotencyKey',
        'digest'];
    key_message constant text := 'must be 1-255 printable ASCII characters without spaces';
    send_at timestamptz;
    expires_at timestamptz;
BEGIN
    IF jsonb_typeof(p) IS DISTINCT FROM 'object' THEN
        RETURN jsonb_build_array(jsonb_build_object('field', '$', 'message',
                                                    'must be a JSON object'));
    END IF;
    storable := nq_json_depth_errors(p, '', 0);
    IF p_key IS NOT NULL AND p_key !~ '^[\x21-\x7e]{1,255}$' THEN
        keyed := jsonb_build_array(jsonb_build_object('field', 'idempotency_key',
                                                      'message', key_message));
    END IF;
    -- parse_request: the required fields, named all at once.
    IF NOT p ? 'recipientId' THEN
        IF NOT p ? 'channel' THEN
            missing := missing || jsonb_build_object('field', 'channel',
                                                     'message', 'is required (or recipientId)');
        END IF;
        IF NOT p ? 'recipient' THEN
            missing := missing || jsonb_build_object('field', 'recipient',
                                                     'message', 'is required (or recipientId)');
        END IF;
    END IF;
    IF NOT p ? 'template' AND NOT p ? 'body' THEN
        missing := missing || jsonb_build_object('field', 'body',
                                                 'message', 'is required (or template)');
    END IF;

    -- The model's fields, in its order (pydantic reports them so).
    v := p -> 'channel';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF v #>> '{}' IN ('email', 'sms', 'push') AND jsonb_typeof(v) = 'string' THEN
            channel_ok := v #>> '{}';
        ELSE
            errs := errs || jsonb_build_object('field', 'channel', 'message',
                                               'Input should be ''email'', ''sms'' or ''push''');
        END IF;
    END IF;
    v := p -> 'recipient';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF jsonb_typeof(v) <> 'string' THEN
            errs := errs || jsonb_build_object('field', 'recipient',
                                               'message', 'Input should be a valid string');
        ELSE
            s := v #>> '{}';
            IF char_length(s) < 1 THEN
                errs := errs || jsonb_build_object('field', 'recipient',
                                                   'message', 'String should have at least 1 character');
            ELSIF char_length(s) > 320 THEN
                errs := errs || jsonb_build_object('field', 'recipient',
                                                   'message', 'String should have at most 320 characters');
            ELSIF s ~ ('^' || ws || '*$') THEN
                errs := errs || jsonb_build_object('field', 'recipient',
                                                   'message', 'must not be blank');
            ELSIF channel_ok = 'email'
                  AND s !~ ('^[^@' || substr(ws, 2, length(ws) - 2) || ']+@[^@'
                            || substr(ws, 2, length(ws) - 2) || ']+\.[^@.'
                            || substr(ws, 2, length(ws) - 2) || ']+$') THEN
                errs := errs || jsonb_build_object('field', 'recipient',
                                                   'message', 'must be an email address for channel email');
            ELSIF channel_ok = 'sms' AND s !~ '^\+[0-9]{8,15}$' THEN
                errs := errs || jsonb_build_object('field', 'recipient', 'message',
                    'must be an E.164 number (+ and 8-15 digits) for channel sms');
            END IF;
        END IF;
    END IF;
    v := p -> 'subject';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF jsonb_typeof(v) <> 'string' THEN
            errs := errs || jsonb_build_object('field', 'subject',
                                               'message', 'Input should be a valid string');
        ELSIF char_length(v #>> '{}') > 998 THEN
            errs := errs || jsonb_build_object('field', 'subject',
                                               'message', 'String should have at most 998 characters');
        END IF;
    END IF;
    v := p -> 'body';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF jsonb_typeof(v) <> 'string' THEN
            errs := errs || jsonb_build_object('field', 'body',
                                               'message', 'Input should be a valid string');
        ELSE
            n := octet_length(v #>> '{}');
            IF n < 1 THEN
                errs := errs || jsonb_build_object('field', 'body', 'message', 'must not be empty');
            ELSIF n > 65536 THEN
                errs := errs || jsonb_build_object('field', 'body', 'message',
                    'is ' || n || ' bytes of UTF-8; the limit is 65536');
            END IF;
        END IF;
    END IF;
    v := p -> 'recipientId';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF jsonb_typeof(v) <> 'string' THEN
            errs := errs || jsonb_build_object('field', 'recipientId',
                                               'message', 'Input should be a valid string');
        ELSIF (v #>> '{}') !~ '^[\x21-\x7e]{1,255}$' THEN
            errs := errs || jsonb_build_object('field', 'recipientId', 'message', key_message);
        END IF;
    END IF;
    v := p -> 'channels';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF jsonb_typeof(v) <> 'array' THEN
            errs := errs || jsonb_build_object('field', 'channels',
                                               'message', 'Input should be a valid list');
        ELSIF jsonb_array_length(v) > 3 THEN
            errs := errs || jsonb_build_object('field', 'channels', 'message',
                'List should have at most 3 items after validation, not ' || jsonb_array_length(v));
        ELSE
            n := 0;
            FOR t IN SELECT 'channels.' || (e.ordinality - 1)
                     FROM jsonb_array_elements(v) WITH ORDINALITY e
                     WHERE jsonb_typeof(e.value) <> 'string'
                        OR e.value #>> '{}' NOT IN ('email', 'sms', 'push')
                     ORDER BY e.ordinality LOOP
                errs := errs || jsonb_build_object('field', t, 'message',
                                                   'Input should be ''email'', ''sms'' or ''push''');
                n := n + 1;
            END LOOP;
            IF n = 0 AND jsonb_array_length(v) < 1 THEN
                errs := errs || jsonb_build_object('field', 'channels', 'message',
                    'List should have at least 1 item after validation, not 0');
            ELSIF n = 0 AND (SELECT count(DISTINCT e) FROM jsonb_array_elements(v) e)
                            <> jsonb_array_length(v) THEN
                errs := errs || jsonb_build_object('field', 'channels',
                                                   'message', 'must not name a channel twice');
            END IF;
        END IF;
    END IF;
    v := p -> 'strategy';
    IF v IS NOT NULL AND v <> 'null'
       AND (jsonb_typeof(v) <> 'string' OR v #>> '{}' NOT IN ('all', 'first')) THEN
        errs := errs || jsonb_build_object('field', 'strategy',
                                           'message', 'Input should be ''all'' or ''first''');
    END IF;
    v := p -> 'category';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF jsonb_typeof(v) <> 'string' THEN
            errs := errs || jsonb_build_object('field', 'category',
                                               'message', 'Input should be a valid string');
        ELSIF (v #>> '{}') !~ '^[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?$' THEN
            errs := errs || jsonb_build_object('field', 'category', 'message',
                'must be 1-63 lowercase letters, digits, ''-'', ''_'' or ''.''');
        END IF;
    END IF;
    v := p -> 'template';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF jsonb_typeof(v) <> 'string' THEN
            errs := errs || jsonb_build_object('field', 'template',
                                               'message', 'Input should be a valid string');
        ELSIF (v #>> '{}') !~ '^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$' THEN
            errs := errs || jsonb_build_object('field', 'template', 'message',
                'must be a template name (lowercase letters, digits, ''-'', ''.'')');
        END IF;
    END IF;
    v := p -> 'data';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF jsonb_typeof(v) <> 'object' THEN
            errs := errs || jsonb_build_object('field', 'data',
                                               'message', 'Input should be a valid dictionary');
        ELSIF octet_length(nq_json_canonical(v)) > 65536 THEN
            errs := errs || jsonb_build_object('field', 'data', 'message',
                'is ' || octet_length(nq_json_canonical(v)) || ' bytes as JSON; the limit is 65536');
        END IF;
    END IF;
    v := p -> 'priority';
    IF v IS NOT NULL AND (jsonb_typeof(v) <> 'string' OR v #>> '{}' NOT IN ('HIGH', 'NORMAL', 'LOW'))
    THEN
        errs := errs || jsonb_build_object('field', 'priority',
                                           'message', 'Input should be ''HIGH'', ''NORMAL'' or ''LOW''');
    END IF;
    v := p -> 'sendAt';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF jsonb_typeof(v) <> 'string' THEN
            errs := errs || jsonb_build_object('field', 'sendAt',
                                               'message', 'Input should be a valid string');
        ELSE
            SELECT r.moment, r.error INTO send_at, t FROM nq_parse_rfc3339(v #>> '{}') r;
            IF t IS NOT NULL THEN
                errs := errs || jsonb_build_object('field', 'sendAt', 'message', t);
            END IF;
        END IF;
    END IF;
    v := p -> 'delaySeconds';
    IF v IS NOT NULL AND v <> 'null' THEN
        -- StrictInt: a JSON number without a fraction or exponent (Python reads those as float).
        IF jsonb_typeof(v) <> 'number' OR v::text !~ '^-?[0-9]+$' THEN
            errs := errs || jsonb_build_object('field', 'delaySeconds',
                                               'message', 'Input should be a valid integer');
        ELSIF v::text::numeric < 0 THEN
            errs := errs || jsonb_build_object('field', 'delaySeconds',
                                               'message', 'Input should be greater than or equal to 0');
        ELSIF v::text::numeric > 31536000 THEN
            errs := errs || jsonb_build_object('field', 'delaySeconds', 'message',
                                               'Input should be less than or equal to 31536000');
        END IF;
    END IF;
    v := p -> 'expiresAt';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF jsonb_typeof(v) <> 'string' THEN
            errs := errs || jsonb_build_object('field', 'expiresAt',
                                               'message', 'Input should be a valid string');
        ELSE
            SELECT r.moment, r.error INTO expires_at, t FROM nq_parse_rfc3339(v #>> '{}') r;
            IF t IS NOT NULL THEN
                errs := errs || jsonb_build_object('field', 'expiresAt', 'message', t);
            END IF;
        END IF;
    END IF;
    v := p -> 'webhookUrl';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF jsonb_typeof(v) <> 'string' THEN
            errs := errs || jsonb_build_object('field', 'webhookUrl',
                                               'message', 'Input should be a valid string');
        ELSIF char_length(v #>> '{}') > 2048 THEN
            errs := errs || jsonb_build_object('field', 'webhookUrl',
                                               'message', 'String should have at most 2048 characters');
        ELSIF (v #>> '{}') !~* ('^https?://[^/?#' || substr(ws, 2, length(ws) - 2) || ']+'
                                || '[^' || substr(ws, 2, length(ws) - 2) || ']*$') THEN
            errs := errs || jsonb_build_object('field', 'webhookUrl',
                                               'message', 'must be an http or https URL');
        END IF;
    END IF;
    v := p -> 'policy';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF jsonb_typeof(v) <> 'string' THEN
            errs := errs || jsonb_build_object('field', 'policy',
                                               'message', 'Input should be a valid string');
        ELSIF (v #>> '{}') !~ '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$' THEN
            errs := errs || jsonb_build_object('field', 'policy', 'message',
                                               'must be namespace/name of a NotificationPolicy');
        END IF;
    END IF;
    v := p -> 'metadata';
    IF v IS NOT NULL THEN
        IF jsonb_typeof(v) <> 'object' THEN
            errs := errs || jsonb_build_object('field', 'metadata',
                                               'message', 'Input should be a valid dictionary');
        ELSIF octet_length(nq_json_canonical(v)) > 16384 THEN
            errs := errs || jsonb_build_object('field', 'metadata', 'message',
                'is ' || octet_length(nq_json_canonical(v)) || ' bytes as JSON; the limit is 16384');
        END IF;
    END IF;
    v := p -> 'idempotencyKey';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF jsonb_typeof(v) <> 'string' THEN
            errs := errs || jsonb_build_object('field', 'idempotencyKey',
                                               'message', 'Input should be a valid string');
        ELSIF (v #>> '{}') !~ '^[\x21-\x7e]{1,255}$' THEN
            errs := errs || jsonb_build_object('field', 'idempotencyKey', 'message', key_message);
        END IF;
    END IF;
    -- digest (0019): services.validation.DigestRequest's fields in its order, then its extras.
    v := p -> 'digest';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF jsonb_typeof(v) <> 'object' THEN
            errs := errs || jsonb_build_object('field', 'digest', 'message',
                'Input should be a valid dictionary or instance of DigestRequest');
        ELSE
            IF NOT v ? 'key' THEN
                errs := errs || jsonb_build_object('field', 'digest.key', 'message', 'Field required');
            ELSIF jsonb_typeof(v -> 'key') <> 'string' THEN
                errs := errs || jsonb_build_object('field', 'digest.key',
                                                   'message', 'Input should be a valid string');
            ELSIF (v ->> 'key') !~ '^[\x21-\x7e]{1,255}$' THEN
                errs := errs || jsonb_build_object('field', 'digest.key', 'message', key_message);
            END IF;
            IF NOT v ? 'windowSeconds' THEN
                errs := errs || jsonb_build_object('field', 'digest.windowSeconds',
                                                   'message', 'Field required');
            ELSE
                t := nq_digest_int_error(v -> 'windowSeconds', 1, 86400);
                IF t IS NOT NULL THEN
                    errs := errs || jsonb_build_object('field', 'digest.windowSeconds', 'message', t);
                END IF;
            END IF;
            IF v ? 'maxItems' THEN
                t := nq_digest_int_error(v -> 'maxItems', 2, 1000);
                IF t IS NOT NULL THEN
                    errs := errs || jsonb_build_object('field', 'digest.maxItems', 'message', t);
                END IF;
            END IF;
            IF COALESCE(v -> 'template', 'null') <> 'null' THEN
                IF jsonb_typeof(v -> 'template') <> 'string' THEN
                    errs := errs || jsonb_build_object('field', 'digest.template',
                                                       'message', 'Input should be a valid string');
                ELSIF (v ->> 'template') !~ '^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$' THEN
                    errs := errs || jsonb_build_object('field', 'digest.template', 'message',
                        'must be a template name (lowercase letters, digits, ''-'', ''.'')');
                END IF;
            END IF;
            FOR t IN SELECT k FROM jsonb_object_keys(v) k
                     WHERE k <> ALL(ARRAY['key', 'windowSeconds', 'maxItems', 'template']) LOOP
                errs := errs || jsonb_build_object('field', 'digest.' || t,
                                                   'message', 'Extra inputs are not permitted');
            END LOOP;
        END IF;
    END IF;
    FOR t IN SELECT k FROM jsonb_object_keys(p) k WHERE k <> ALL(allowed) LOOP
        errs := errs || jsonb_build_object('field', t, 'message', 'Extra inputs are not permitted');
    END LOOP;

    -- The model's cross-field check: only when every field is valid, the first rule broken.
    IF jsonb_array_length(errs) = 0 THEN
        crossed := CASE
            WHEN p ? 'sendAt' AND p -> 'sendAt' <> 'null'
                 AND p ? 'delaySeconds' AND p -> 'delaySeconds' <> 'null' THEN
                jsonb_build_object('field', 'sendAt',
                                   'message', 'give sendAt or delaySeconds, not both')
            WHEN COALESCE(p -> 'recipientId', 'null') <> 'null'
                 AND COALESCE(p -> 'recipient', 'null') <> 'null' THEN
                jsonb_build_object('field', 'recipient',
                                   'message', 'give recipient or recipientId, not both')
            WHEN COALESCE(p -> 'recipientId', 'null') <> 'null'
                 AND COALESCE(p -> 'channel', 'null') <> 'null' THEN
                jsonb_build_object('field', 'channel',
                                   'message', 'with recipientId, name channels (a list) instead')
            WHEN COALESCE(p -> 'recipientId', 'null') = 'null'
                 AND COALESCE(p -> 'channel', 'null') = 'null' THEN
                jsonb_build_object('field', 'channel', 'message', 'is required (or recipientId)')
            WHEN COALESCE(p -> 'recipientId', 'null') = 'null'
                 AND COALESCE(p -> 'recipient', 'null') = 'null' THEN
                jsonb_build_object('field', 'recipient', 'message', 'is required (or recipientId)')
            WHEN COALESCE(p -> 'recipientId', 'null') = 'null'
                 AND COALESCE(p -> 'channels', 'null') <> 'null' THEN
                jsonb_build_object('field', 'channels', 'message', 'only with recipientId')
            WHEN COALESCE(p -> 'recipientId', 'null') = 'null'
                 AND COALESCE(p -> 'strategy', 'null') <> 'null' THEN
                jsonb_build_object('field', 'strategy', 'message', 'only with recipientId')
            WHEN COALESCE(p -> 'template', 'null') <> 'null'
                 AND (COALESCE(p -> 'body', 'null') <> 'null'
                      OR COALESCE(p -> 'subject', 'null') <> 'null') THEN
                jsonb_build_object('field', 'template', 'message',
                                   'give template + data or subject + body, not both')
            WHEN COALESCE(p -> 'template', 'null') = 'null'
                 AND COALESCE(p -> 'data', 'null') <> 'null' THEN
                jsonb_build_object('field', 'data', 'message', 'only with template')
            WHEN COALESCE(p -> 'template', 'null') = 'null'
                 AND COALESCE(p -> 'body', 'null') = 'null' THEN
                jsonb_build_object('field', 'body', 'message', 'is required (or template)')
            -- digest (0019), as the model's check after the others.
            WHEN COALESCE(p -> 'digest', 'null') <> 'null' AND p ->> 'priority' = 'HIGH' THEN
                jsonb_build_object('field', 'digest', 'message', 'not with priority HIGH')
            WHEN COALESCE(p -> 'digest', 'null') <> 'null'
                 AND (COALESCE(p -> 'sendAt', 'null') <> 'null'
                      OR COALESCE(p -> 'delaySeconds', 'null') <> 'null') THEN
                jsonb_build_object('field', 'digest', 'message',
                    'not with sendAt or delaySeconds (the digest''s window decides when it is sent)')
            WHEN COALESCE(p -> 'digest', 'null') <> 'null'
                 AND COALESCE(p -> 'expiresAt', 'null') <> 'null' THEN
                jsonb_build_object('field', 'digest', 'message',
                    'not with expiresAt (the digest is sent as one message)')
        END;
        IF crossed IS NOT NULL THEN
            crossed := jsonb_build_array(crossed);
        ELSE
            crossed := '[]';
        END IF;
    END IF;

    -- The create's own checks of the key (routes_notifications._one_request).
    IF p_key IS NOT NULL AND jsonb_typeof(p -> 'idempotencyKey') = 'string'
       AND p ->> 'idempotencyKey' <> p_key THEN
        late := late || jsonb_build_object('field', 'idempotencyKey',
                                           'message', 'differs from the idempotency_key argument');
    END IF;
    IF p_key IS NULL AND COALESCE(p -> 'idempotencyKey', 'null') = 'null' THEN
        late := late || jsonb_build_object('field', 'idempotency_key', 'message',
            'is required: pass idempotency_key or idempotencyKey in the request');
    END IF;
    errs := storable || keyed || missing || errs || crossed || late;
    IF jsonb_array_length(errs) = 0 THEN
        -- prepare_request: expiresAt after the send time (sendAt, else now + delaySeconds).
        IF expires_at IS NOT NULL
           AND expires_at <= COALESCE(send_at, now() + make_interval(
                   secs => COALESCE((p ->> 'delaySeconds')::numeric, 0)::double precision)) THEN
            RETURN jsonb_build_array(jsonb_build_object('field', 'expiresAt',
                                                        'message', 'must be after the send time'));
        END IF;
        RETURN errs;
    END IF;
    -- Each error once, in order (the API's dict.fromkeys).
    RETURN (SELECT jsonb_agg(e ORDER BY first) FROM (
        SELECT e, min(i) AS first FROM jsonb_array_elements(errs) WITH ORDINALITY AS x(e, i)
        GROUP BY e) d);
END $$;

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
                   ELSE (SELECT jsonb_build_object('key', d.key, 'id', d.id,
                                                   'count', d.item_count)
                         FROM nq_digests d WHERE d.bucket = n.bucket AND d.id = n.digest_id) END);

-- The enqueue function of 0016, passing `digest` on to the insert path (the rest unchanged; its
-- grants stay: CREATE OR REPLACE keeps them; its search_path is set again below).
CREATE OR REPLACE FUNCTION notify_queue_enqueue(request jsonb, idempotency_key text) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    errs jsonb;
    v_key text;
    v_hash text;
    v_max_attempts integer := COALESCE(NULLIF(current_setting('notify_queue.max_attempts', true),
                                            '')::integer, 6);
    v_webhook_url text := NULLIF(current_setting('notify_queue.webhook_url', true), '');
    v_send_at timestamptz;
    v_expires_at timestamptz;
    keys text[];
    stored nq_all_notifications;
    items jsonb := '[]';
    base jsonb;
    recipient record;
    order_ text[];
    usable text[] := '{}';
    chosen text[] := '{}';
    why text[] := '{}';
    c text;
    contact text;
    reason text;
    v_category text;
    ids uuid[];
    answer jsonb;
BEGIN
    -- 0.1.0's triggers stay silent for the rest of this transaction: this function writes their
    -- work itself (0012). Set here, not as the function's SET clause, which a migrating user who
    -- is not a superuser may not attach for a custom parameter.
    PERFORM set_config('nq.explicit', 'on', true);
    errs := nq_enqueue_errors(request, idempotency_key);
    IF jsonb_array_length(errs) > 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = (SELECT string_agg((e ->> 'field') || ': ' || (e ->> 'message'), '; ')
                       FROM jsonb_array_elements(errs) e),
            DETAIL = errs::text,
            HINT = 'the same rules as POST /notifications (docs/enqueue.md)';
    END IF;
    IF COALESCE(request -> 'template', 'null') <> 'null' THEN
        RAISE EXCEPTION USING ERRCODE = 'feature_not_supported',
            MESSAGE = 'not supported in SQL: template (templates are rendered by the API, in '
                      'Jinja2); render subject and body yourself, or create through the API';
    END IF;
    v_key := COALESCE(idempotency_key, request ->> 'idempotencyKey');
    v_hash := encode(sha256(convert_to(nq_json_canonical(request - 'idempotencyKey'), 'UTF8')),
                   'hex');
    v_send_at := COALESCE((nq_parse_rfc3339(request ->> 'sendAt')).moment,
                        now() + make_interval(secs => COALESCE(
                            (request ->> 'delaySeconds')::double precision, 0)));
    v_expires_at := (nq_parse_rfc3339(request ->> 'expiresAt')).moment;
    v_category := COALESCE(request ->> 'category', 'transactional');
    base := jsonb_build_object(
        'request_hash', v_hash, 'subject', request ->> 'subject', 'body', request ->> 'body',
        'priority', array_position(ARRAY['HIGH', 'NORMAL', 'LOW'],
                                   COALESCE(request ->> 'priority', 'NORMAL')) - 1,
        'send_at', v_send_at, 'expires_at', v_expires_at, 'source', 'sql',
        'policy', request ->> 'policy', 'webhook_url', request ->> 'webhookUrl',
        'metadata', COALESCE(request -> 'metadata', '{}'), 'status', 'PENDING',
        'category', v_category, 'recipient_id', request ->> 'recipientId',
        -- digest (0019): joined by nq_insert_digest_items, as the API's creates are.
        'digest_key', request #>> '{digest,key}',
        'digest_window_seconds', (request #>> '{digest,windowSeconds}')::integer,
        'digest_max_items', COALESCE((request #>> '{digest,maxItems}')::integer, 100),
        'digest_template', request #>> '{digest,template}');

    IF request ->> 'recipientId' IS NULL THEN
        -- An address: one notification under the key itself.
        IF COALESCE(request -> 'digest', 'null') <> 'null' THEN
            PERFORM FROM nq_insert_digest_items(
                jsonb_build_array(base || jsonb_build_object(
                    'position', 0, 'id', gen_random_uuid(), 'idempotency_key', v_key,
                    'channel', request ->> 'channel', 'recipient', request ->> 'recipient'))::json,
                v_max_attempts, v_webhook_url) i;
        ELSE
            PERFORM FROM nq_insert_notifications(
                jsonb_build_array(base || jsonb_build_object(
                    'position', 0, 'id', gen_random_uuid(), 'idempotency_key', v_key,
                    'channel', request ->> 'channel', 'recipient', request ->> 'recipient'))::json,
                v_max_attempts, v_webhook_url) i;
        END IF;
        IF FOUND THEN
            PERFORM pg_notify('nq_wakeup', '');
        END IF;
        SELECT n.* INTO stored FROM nq_all_notifications n
        WHERE n.id = (SELECT k.notification_id FROM nq_idempotency_keys k WHERE k.key = v_key);
        IF stored.request_hash <> v_hash THEN
            RAISE EXCEPTION USING ERRCODE = 'unique_violation',
                MESSAGE = 'idempotency key ' || quote_literal(v_key)
                          || ' was already used with a different request, by notification '
                          || stored.id;
        END IF;
        RETURN nq_notification_json(stored);
    END IF;

    -- A stored recipient (services.notifications._enqueue_targeted): serialised per request key,
    -- answered from what the key became when seen before, else expanded over the channels.
    PERFORM pg_advisory_xact_lock(hashtextextended('nq-request:' || v_key, 0));
    keys := ARRAY[v_key, v_key || ' email', v_key || ' sms', v_key || ' push', v_key || ' suppressed'];
    IF EXISTS (SELECT 1 FROM nq_idempotency_keys k WHERE k.key = ANY(keys)) THEN
        ids := ARRAY(SELECT n.id FROM nq_all_notifications n
                     WHERE n.id = ANY(ARRAY(SELECT k.notification_id FROM nq_idempotency_keys k
                                            WHERE k.key = ANY(keys)))
                     ORDER BY array_position(keys, n.idempotency_key));
        IF (SELECT bool_or(n.request_hash <> v_hash OR n.idempotency_key = v_key)
            FROM nq_all_notifications n WHERE n.id = ANY(ids)) THEN
            RAISE EXCEPTION USING ERRCODE = 'unique_violation',
                MESSAGE = 'idempotency key ' || quote_literal(v_key)
                          || ' was already used with a different request, by notification '
                          || ids[1];
        END IF;
        RETURN jsonb_build_object('notifications', (
            SELECT jsonb_agg(nq_notification_json(n) ORDER BY array_position(ids, n.id))
            FROM nq_all_notifications n WHERE n.id = ANY(ids)));
    END IF;
    SELECT r.* INTO recipient FROM nq_recipients r WHERE r.id = request ->> 'recipientId';
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'recipientId: no recipient with id ' || (request ->> 'recipientId'),
            DETAIL = jsonb_build_array(jsonb_build_object(
                'field', 'recipientId',
                'message', 'no recipient with id ' || (request ->> 'recipientId')))::text;
    END IF;
    order_ := COALESCE(ARRAY(SELECT jsonb_array_elements_text(request -> 'channels')),
                       ARRAY['email', 'sms', 'push']);
    IF cardinality(order_) = 0 THEN
        order_ := ARRAY['email', 'sms', 'push'];
    END IF;
    FOREACH c IN ARRAY order_ LOOP
        contact := CASE c WHEN 'email' THEN recipient.email WHEN 'sms' THEN recipient.phone
                          ELSE recipient.push_tokens[1] END;
        IF contact IS NULL THEN
            CONTINUE;
        END IF;
        usable := usable || c;
        -- services.preferences.opt_out_reason
        reason := CASE
            WHEN recipient.opt_out_all THEN 'the recipient opted out of everything'
            WHEN c = ANY(recipient.opt_out_channels) THEN 'the recipient opted out of channel ' || c
            WHEN v_category = ANY(recipient.opt_out_categories)
                THEN 'the recipient opted out of category ' || v_category
        END;
        IF reason IS NULL THEN
            IF request ->> 'strategy' IS DISTINCT FROM 'first' OR cardinality(chosen) = 0 THEN
                chosen := chosen || c;
                items := items || (base || jsonb_build_object(
                    'position', cardinality(chosen), 'id', gen_random_uuid(),
                    'idempotency_key', v_key || ' ' || c, 'channel', c, 'recipient', contact));
            END IF;
        ELSE
            why := why || (c || ': ' || reason);
        END IF;
    END LOOP;
    IF cardinality(chosen) = 0 THEN
        FOREACH c IN ARRAY order_ LOOP
            IF NOT c = ANY(usable) THEN
                why := why || (c || ': no contact');
            END IF;
        END LOOP;
        c := COALESCE(usable[1], order_[1]);
        contact := CASE c WHEN 'email' THEN recipient.email WHEN 'sms' THEN recipient.phone
                          ELSE recipient.push_tokens[1] END;
        items := jsonb_build_array(base || jsonb_build_object(
            'position', 0, 'id', gen_random_uuid(), 'idempotency_key', v_key || ' suppressed',
            'channel', c, 'recipient', COALESCE(contact, recipient.id),
            'body', COALESCE(request ->> 'body', ''), 'status', 'SUPPRESSED',
            'last_error', 'suppressed: ' || array_to_string(why, '; ')));
        PERFORM nq_delivery_log_ready();
    END IF;
    IF COALESCE(request -> 'digest', 'null') <> 'null' THEN
        ids := ARRAY(SELECT i.id FROM nq_insert_digest_items(items::json, v_max_attempts,
                                                             v_webhook_url) i);
    ELSE
        ids := ARRAY(SELECT i.id FROM nq_insert_notifications(items::json, v_max_attempts,
                                                              v_webhook_url) i);
    END IF;
    IF cardinality(chosen) > 0 THEN
        PERFORM pg_notify('nq_wakeup', '');
    END IF;
    SELECT jsonb_agg(nq_notification_json(n) ORDER BY array_position(ids, n.id)) INTO answer
    FROM nq_all_notifications n WHERE n.id = ANY(ids);
    RETURN jsonb_build_object('notifications', answer);
END $$;

-- CREATE OR REPLACE keeps the grants but not the function's SET clause: fixed again as in 0016.
DO $$
BEGIN
    EXECUTE 'ALTER FUNCTION notify_queue_enqueue(jsonb, text) SET search_path = '
            || quote_ident(current_schema()) || ', pg_temp';
END $$;
