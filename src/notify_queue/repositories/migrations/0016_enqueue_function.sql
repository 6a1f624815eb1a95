-- Enqueue in your own transaction (docs/enqueue.md has the reasons).
--
-- notify_queue_enqueue(request jsonb, idempotency_key text) takes the body of a single
-- POST /notifications, validates it as the API does, inserts in the caller's transaction and
-- wakes workers at its commit (pg_notify is transactional). A rollback leaves nothing.
--
-- 1. One insert path: the statement the API enqueues with (notification_insert_many) becomes the
--    function nq_insert_notifications, which the API's statement and this function both call.
-- 2. The rules: nq_enqueue_errors mirrors services.validation (pydantic's field checks, then the
--    cross-field checks, then expiresAt against the send time) with the same fields and
--    messages; tests/enqueue/cases.py runs every case through the API and the function and
--    compares field and message, so the two cannot drift apart unseen.
-- 3. notify_queue_enqueue is SECURITY DEFINER with a fixed search_path, EXECUTE revoked from
--    PUBLIC; `notify-queue migrate` grants it to the role notify_queue_enqueue (schema.py).

-- The batch insert of the API (repositories/sql/notifications.sql had it as a statement; the
-- comments there still explain each step). Returns the rows inserted: a key that existed
-- already inserts nothing, and the caller reads the existing row.
CREATE FUNCTION nq_insert_notifications(
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
        traceparent text, position bigint)
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
           nq_bucket(COALESCE(r.recipient_id, r.recipient)) AS bucket, r.traceparent
    FROM request r
    JOIN keys k ON k.notification_id = r.id
    LEFT JOIN nq_policies p ON p.name = r.policy
), queued AS (
    INSERT INTO nq_jobs AS n (
        id, idempotency_key, request_hash, channel, recipient, subject, body, priority, status,
        send_at, next_attempt_at, expires_at, max_attempts, source, policy, webhook_url,
        metadata, last_error, finished_at, category, recipient_id, template_name,
        template_version, bucket, traceparent, waiting_reason, waiting_until, waiting_detail)
    SELECT a.id, a.idempotency_key, a.request_hash, a.channel, a.recipient, a.subject, a.body,
           a.priority, a.status, a.send_at, a.next_attempt_at, a.expires_at, a.max_attempts,
           a.source, a.policy, a.webhook_url, a.metadata, a.last_error, a.finished_at,
           a.category, a.recipient_id, a.template_name, a.template_version, a.bucket,
           a.traceparent,
           CASE WHEN a.send_at > now() THEN 'Scheduled' END,
           CASE WHEN a.send_at > now() THEN a.send_at END,
           CASE WHEN a.send_at > now() THEN 'sendAt is in the future' END
    FROM accepted a WHERE a.status = 'PENDING'
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

-- JSON as Python's json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False) writes
-- it: the API's request hash is taken over that text (services.validation.request_hash), so the
-- same request through either door hashes the same. Keys in code point order (UTF-8 bytes,
-- COLLATE "C"); strings escaped as jsonb escapes them, which is what Python escapes. Numbers are
-- written as jsonb keeps them: an integer or a decimal as Python prints a float hash the same;
-- another spelling (1.50, 1e3) may not (docs/enqueue.md).
CREATE FUNCTION nq_json_canonical(p jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    CASE jsonb_typeof(p)
    WHEN 'object' THEN
        RETURN '{' || COALESCE((SELECT string_agg(to_json(e.key)::text || ':'
                                                  || nq_json_canonical(e.value), ','
                                                  ORDER BY e.key COLLATE "C")
                                FROM jsonb_each(p) e), '') || '}';
    WHEN 'array' THEN
        RETURN '[' || COALESCE((SELECT string_agg(nq_json_canonical(e.value), ','
                                                  ORDER BY e.ordinality)
                                FROM jsonb_array_elements(p) WITH ORDINALITY e), '') || ']';
    ELSE
        RETURN p::text;
    END CASE;
END $$;

-- body.storable_errors' depth rule: an object or array nested 32 levels deep is not data.
CREATE FUNCTION nq_json_depth_errors(p jsonb, p_path text, p_depth integer) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    found jsonb := '[]';
    e record;
BEGIN
    IF jsonb_typeof(p) NOT IN ('object', 'array') THEN
        RETURN found;
    END IF;
    IF p_depth >= 32 THEN
        RETURN jsonb_build_array(jsonb_build_object(
            'field', COALESCE(NULLIF(p_path, ''), '$'),
            'message', 'nests deeper than 32 levels'));
    END IF;
    IF jsonb_typeof(p) = 'object' THEN
        FOR e IN SELECT key, value FROM jsonb_each(p) LOOP
            found := found || nq_json_depth_errors(
                e.value, CASE WHEN p_path = '' THEN e.key ELSE p_path || '.' || e.key END,
                p_depth + 1);
        END LOOP;
    ELSE
        FOR e IN SELECT value, ordinality - 1 AS i FROM jsonb_array_elements(p) WITH ORDINALITY
        LOOP
            found := found || nq_json_depth_errors(e.value, p_path || '[' || e.i || ']',
                                                   p_depth + 1);
        END LOOP;
    END IF;
    RETURN found;
END $$;

-- An RFC 3339 timestamp with an offset as services.validation.parse_rfc3339 reads it, or NULL
-- with the message in p_error. Checked field by field before the cast, because PostgreSQL
-- accepts what Python refuses (24:00:00, a 60th second, year 0).
CREATE FUNCTION nq_parse_rfc3339(p text, OUT moment timestamptz, OUT error text)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    m text[];
BEGIN
    m := regexp_match(p, '^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d{1,9})?([Zz]|([+-])(\d{2}):(\d{2}))$');
    IF m IS NULL THEN
        error := 'must be an RFC 3339 date-time with an offset, e.g. 2026-09-24T12:00:00Z';
        RETURN;
    END IF;
    IF m[1]::int < 1 OR m[4]::int > 23 OR m[5]::int > 59 OR m[6]::int > 59
       OR COALESCE(m[10]::int, 0) > 23 OR COALESCE(m[11]::int, 0) > 59 THEN
        error := 'is not a valid date-time';
        RETURN;
    END IF;
    BEGIN
        -- Python keeps microseconds: trim digits past the sixth.
        moment := (m[1] || '-' || m[2] || '-' || m[3] || ' ' || m[4] || ':' || m[5] || ':'
                   || m[6] || COALESCE(substr(m[7], 1, 7), '') || ' '
                   || CASE WHEN upper(m[8]) = 'Z' THEN '+00:00' ELSE m[8] END)::timestamptz;
    EXCEPTION WHEN datetime_field_overflow OR invalid_datetime_format
                   OR invalid_time_zone_displacement_value THEN
        error := 'is not a valid date-time';
        RETURN;
    END;
    -- datetime's range, in UTC (year 1 with a positive offset leaves it).
    IF moment < '0001-01-01 00:00:00+00' OR moment >= '10000-01-01 00:00:00+00' THEN
        moment := NULL;
        error := 'is not a valid date-time';
    END IF;
END $$;

-- Every bad field of a request, as services.validation and the API's create name them
-- ([{field, message}], in the API's order; empty: valid). p_key plays the Idempotency-Key
-- header; its field is `idempotency_key`, as the function's argument is called.
CREATE FUNCTION nq_enqueue_errors(p jsonb, p_key text) RETURNS jsonb
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
        'escalation', 'digest'];
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
        IF v #>> '{}' IN ('email', 'sms', 'push', 'voice') AND jsonb_typeof(v) = 'string' THEN
            channel_ok := v #>> '{}';
        ELSE
            errs := errs || jsonb_build_object('field', 'channel', 'message',
                                               'Input should be ''email'', ''sms'', ''push'' or ''voice''');
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
            ELSIF channel_ok IN ('sms', 'voice') AND s !~ '^\+[0-9]{8,15}$' THEN
                errs := errs || jsonb_build_object('field', 'recipient', 'message',
                    'must be an E.164 number (+ and 8-15 digits) for channel ' || channel_ok);
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
        ELSIF jsonb_array_length(v) > 4 THEN
            errs := errs || jsonb_build_object('field', 'channels', 'message',
                'List should have at most 4 items after validation, not ' || jsonb_array_length(v));
        ELSE
            n := 0;
            FOR t IN SELECT 'channels.' || (e.ordinality - 1)
                     FROM jsonb_array_elements(v) WITH ORDINALITY e
                     WHERE jsonb_typeof(e.value) <> 'string'
                        OR e.value #>> '{}' NOT IN ('email', 'sms', 'push', 'voice')
                     ORDER BY e.ordinality LOOP
                errs := errs || jsonb_build_object('field', t, 'message',
                                                   'Input should be ''email'', ''sms'', ''push'' or ''voice''');
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
            WHEN COALESCE(p -> 'digest', 'null') <> 'null'
                 AND COALESCE(p -> 'escalation', 'null') <> 'null' THEN
                jsonb_build_object('field', 'digest', 'message', 'not with escalation')
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

-- A time as the API writes it (schemas.rfc3339): UTC, `Z`, microseconds only when there are any.
CREATE FUNCTION nq_rfc3339(p timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN p IS NULL THEN NULL ELSE
    to_char(p AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
    || CASE WHEN to_char(p AT TIME ZONE 'UTC', 'US') = '000000' THEN ''
            ELSE to_char(p AT TIME ZONE 'UTC', '.US') END
    || 'Z' END;

-- A notification as the API answers it (schemas.notification_json; tests/enqueue compares the
-- two for the same row).
CREATE FUNCTION nq_notification_json(n nq_all_notifications) RETURNS jsonb
LANGUAGE sql STABLE
RETURN jsonb_build_object(
    'id', n.id, 'idempotencyKey', n.idempotency_key, 'channel', n.channel,
    'recipient', n.recipient, 'subject', n.subject, 'body', n.body,
    'priority', (ARRAY['HIGH', 'NORMAL', 'LOW'])[n.priority + 1], 'status', n.status,
    'sendAt', nq_rfc3339(n.send_at), 'nextAttemptAt', nq_rfc3339(n.next_attempt_at),
    'expiresAt', nq_rfc3339(n.expires_at), 'attemptCount', n.attempt_count,
    'maxAttempts', n.max_attempts, 'lastError', n.last_error, 'sentAt', nq_rfc3339(n.sent_at),
    'providerMessageId', n.provider_message_id, 'provider', n.provider,
    'deliveryAttempts', n.delivery_attempts, 'retries', n.retries, 'source', n.source,
    'metadata', n.metadata, 'createdAt', nq_rfc3339(n.created_at),
    'updatedAt', nq_rfc3339(n.updated_at), 'category', n.category,
    'recipientId', n.recipient_id,
    'template', CASE WHEN n.template_name IS NULL THEN NULL
                     ELSE jsonb_build_object('name', n.template_name,
                                             'version', n.template_version) END);

-- Enqueue in the caller's transaction: the body of a single POST /notifications
-- (docs/api-reference.md) and its idempotency key (NULL: the request's idempotencyKey). Answers as
-- the API does: the notification, or {"notifications": [...]} for a recipientId request; the
-- original for a repeat of the key with the same request. Raises 22023 naming every bad field (the
-- message as the API's detail, DETAIL the errors as JSON), 23505 for the key with another request,
-- 0A000 for what only the API can do (templates: rendered by Jinja2 in Python).
-- The defaults the API takes from its flags come from settings here: notify_queue.max_attempts
-- [6] and notify_queue.webhook_url (docs/enqueue.md: `ALTER DATABASE ... SET`).
CREATE FUNCTION notify_queue_enqueue(request jsonb, idempotency_key text) RETURNS jsonb
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
    v_id uuid;
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
    IF COALESCE(request -> 'escalation', 'null') <> 'null' THEN
        RAISE EXCEPTION USING ERRCODE = 'feature_not_supported',
            MESSAGE = 'not supported in SQL: escalation (an escalation is created through the '
                      'API: POST /notifications with recipientId and escalation)';
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
        -- The key first, then the row by id: two statements (Citus plans no subquery of the
        -- keys, distributed by key, inside a read of the view, distributed by bucket).
        SELECT k.notification_id INTO v_id FROM nq_idempotency_keys k WHERE k.key = v_key;
        SELECT n.* INTO stored FROM nq_all_notifications n WHERE n.id = v_id;
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
    keys := ARRAY[v_key, v_key || ' email', v_key || ' sms', v_key || ' push', v_key || ' voice',
             v_key || ' suppressed'];
    IF EXISTS (SELECT 1 FROM nq_idempotency_keys k WHERE k.key = ANY(keys)) THEN
        ids := ARRAY(SELECT k.notification_id FROM nq_idempotency_keys k WHERE k.key = ANY(keys));
        ids := ARRAY(SELECT n.id FROM nq_all_notifications n WHERE n.id = ANY(ids)
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
    SELECT r.*, v.voice INTO recipient FROM nq_recipients r
    LEFT JOIN nq_recipient_voices v ON v.recipient_id = r.id
    WHERE r.id = request ->> 'recipientId';
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
                          WHEN 'voice' THEN COALESCE(recipient.voice, recipient.phone)
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
                          WHEN 'voice' THEN COALESCE(recipient.voice, recipient.phone)
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

-- Only the roles it is granted to (`notify-queue migrate` grants notify_queue_enqueue); it runs
-- as its owner, the migrating user, on this schema's objects whatever the caller's search_path.
REVOKE EXECUTE ON FUNCTION notify_queue_enqueue(jsonb, text) FROM PUBLIC;
DO $$
BEGIN
    EXECUTE 'ALTER FUNCTION notify_queue_enqueue(jsonb, text) SET search_path = '
            || quote_ident(current_schema()) || ', pg_temp';
END $$;
