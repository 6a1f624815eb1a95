-- Digests in the SQL door (issue 22, docs/digests.md), expand step. 0019 made the schema and
-- the insert path of digests; the enqueue function's rules (nq_enqueue_errors, last defined by
-- 0020) and the function itself (notify_queue_enqueue: 0020, then 0021 from 0016's text) were
-- defined again by those later migrations, so `digest` is taught to their newest versions
-- here, and 0020's escalation and voice handling that 0021's copy lost is restored: the same rules as services.validation.DigestRequest (tests/enqueue/cases.py runs them
-- through both doors), and an item with a digest goes through nq_insert_digest_items (0019).
-- Same names, arguments and results: callers are unchanged.

-- 0020's rules with `digest` (its fields after escalation's, as the model's, then the model's
-- cross-field checks after the others).
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

-- The function as 0020 made it (escalation refused with 0A000, voice) with 0021's two-statement
-- key reads (0021 defined it again from 0016's text, which dropped 0020's escalation and voice
-- handling), passing `digest` on to the insert path of digests. Its grants stay (CREATE OR
-- REPLACE keeps them); its search_path is set again below.
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
        -- keys, distributed by key, inside a read of the view, distributed by bucket; 0021).
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

-- CREATE OR REPLACE keeps the grants but not the function's SET clause: fixed again as in 0016.
DO $$
BEGIN
    EXECUTE 'ALTER FUNCTION notify_queue_enqueue(jsonb, text) SET search_path = '
            || quote_ident(current_schema()) || ', pg_temp';
END $$;
