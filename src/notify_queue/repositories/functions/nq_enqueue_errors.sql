-- The enqueue request's errors as the API reports them (services/validation.py): the field
-- checks, then the cross-field checks; tests/enqueue/cases.py runs every case through both.
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
    IF p_key IS NOT NULL AND p_key !~ '{{limit:IDEMPOTENCY_KEY_PATTERN}}' THEN
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
        IF v #>> '{}' IN ({{limit:CHANNELS}}) AND jsonb_typeof(v) = 'string' THEN
            channel_ok := v #>> '{}';
        ELSE
            errs := errs || jsonb_build_object('field', 'channel', 'message',
                                               '{{limit:CHANNEL_MESSAGE}}');
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
            ELSIF char_length(s) > {{limit:MAX_RECIPIENT_CHARS}} THEN
                errs := errs || jsonb_build_object('field', 'recipient',
                                                   'message', 'String should have at most {{limit:MAX_RECIPIENT_CHARS}} characters');
            ELSIF s ~ ('^' || ws || '*$') THEN
                errs := errs || jsonb_build_object('field', 'recipient',
                                                   'message', 'must not be blank');
            ELSIF channel_ok = 'email'
                  AND s !~ ('^[^@' || substr(ws, 2, length(ws) - 2) || ']+@[^@'
                            || substr(ws, 2, length(ws) - 2) || ']+\.[^@.'
                            || substr(ws, 2, length(ws) - 2) || ']+$') THEN
                errs := errs || jsonb_build_object('field', 'recipient',
                                                   'message', 'must be an email address for channel email');
            ELSIF channel_ok IN ('sms', 'voice') AND s !~ '{{limit:SMS_PATTERN}}' THEN
                errs := errs || jsonb_build_object('field', 'recipient', 'message',
                    'must be an E.164 number (+ and 8-15 digits) for channel ' || channel_ok);
            ELSIF channel_ok IN ({{limit:DESTINATION_CHANNELS}})
                  AND s !~ '{{limit:DESTINATION_PATTERN}}' THEN
                errs := errs || jsonb_build_object('field', 'recipient', 'message',
                    '{{limit:DESTINATION_MESSAGE}} for channel ' || channel_ok);
            END IF;
        END IF;
    END IF;
    v := p -> 'subject';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF jsonb_typeof(v) <> 'string' THEN
            errs := errs || jsonb_build_object('field', 'subject',
                                               'message', 'Input should be a valid string');
        ELSIF char_length(v #>> '{}') > {{limit:MAX_SUBJECT_CHARS}} THEN
            errs := errs || jsonb_build_object('field', 'subject',
                                               'message', 'String should have at most {{limit:MAX_SUBJECT_CHARS}} characters');
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
            ELSIF n > {{limit:MAX_BODY_BYTES}} THEN
                errs := errs || jsonb_build_object('field', 'body', 'message',
                    'is ' || n || ' bytes of UTF-8; the limit is {{limit:MAX_BODY_BYTES}}');
            END IF;
        END IF;
    END IF;
    v := p -> 'recipientId';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF jsonb_typeof(v) <> 'string' THEN
            errs := errs || jsonb_build_object('field', 'recipientId',
                                               'message', 'Input should be a valid string');
        ELSIF (v #>> '{}') !~ '{{limit:IDEMPOTENCY_KEY_PATTERN}}' THEN
            errs := errs || jsonb_build_object('field', 'recipientId', 'message', key_message);
        END IF;
    END IF;
    v := p -> 'channels';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF jsonb_typeof(v) <> 'array' THEN
            errs := errs || jsonb_build_object('field', 'channels',
                                               'message', 'Input should be a valid list');
        ELSIF jsonb_array_length(v) > {{limit:MAX_CHANNELS}} THEN
            errs := errs || jsonb_build_object('field', 'channels', 'message',
                'List should have at most {{limit:MAX_CHANNELS}} items after validation, not ' || jsonb_array_length(v));
        ELSE
            n := 0;
            FOR t IN SELECT 'channels.' || (e.ordinality - 1)
                     FROM jsonb_array_elements(v) WITH ORDINALITY e
                     WHERE jsonb_typeof(e.value) <> 'string'
                        OR e.value #>> '{}' NOT IN ({{limit:CHANNELS}})
                     ORDER BY e.ordinality LOOP
                errs := errs || jsonb_build_object('field', t, 'message',
                                                   '{{limit:CHANNEL_MESSAGE}}');
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
        ELSIF (v #>> '{}') !~ '{{limit:CATEGORY_PATTERN}}' THEN
            errs := errs || jsonb_build_object('field', 'category', 'message',
                'must be 1-63 lowercase letters, digits, ''-'', ''_'' or ''.''');
        END IF;
    END IF;
    v := p -> 'template';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF jsonb_typeof(v) <> 'string' THEN
            errs := errs || jsonb_build_object('field', 'template',
                                               'message', 'Input should be a valid string');
        ELSIF (v #>> '{}') !~ '{{limit:TEMPLATE_NAME_PATTERN}}' THEN
            errs := errs || jsonb_build_object('field', 'template', 'message',
                'must be a template name (lowercase letters, digits, ''-'', ''.'')');
        END IF;
    END IF;
    v := p -> 'data';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF jsonb_typeof(v) <> 'object' THEN
            errs := errs || jsonb_build_object('field', 'data',
                                               'message', 'Input should be a valid dictionary');
        ELSIF octet_length(nq_json_canonical(v)) > {{limit:MAX_DATA_BYTES}} THEN
            errs := errs || jsonb_build_object('field', 'data', 'message',
                'is ' || octet_length(nq_json_canonical(v)) || ' bytes as JSON; the limit is {{limit:MAX_DATA_BYTES}}');
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
        ELSIF v::text::numeric > {{limit:MAX_DELAY_SECONDS}} THEN
            errs := errs || jsonb_build_object('field', 'delaySeconds', 'message',
                                               'Input should be less than or equal to {{limit:MAX_DELAY_SECONDS}}');
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
        ELSIF char_length(v #>> '{}') > {{limit:MAX_WEBHOOK_URL_CHARS}} THEN
            errs := errs || jsonb_build_object('field', 'webhookUrl',
                                               'message', 'String should have at most {{limit:MAX_WEBHOOK_URL_CHARS}} characters');
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
        ELSIF (v #>> '{}') !~ '{{limit:POLICY_PATTERN}}' THEN
            errs := errs || jsonb_build_object('field', 'policy', 'message',
                                               'must be namespace/name of a NotificationPolicy');
        END IF;
    END IF;
    v := p -> 'metadata';
    IF v IS NOT NULL THEN
        IF jsonb_typeof(v) <> 'object' THEN
            errs := errs || jsonb_build_object('field', 'metadata',
                                               'message', 'Input should be a valid dictionary');
        ELSIF octet_length(nq_json_canonical(v)) > {{limit:MAX_METADATA_BYTES}} THEN
            errs := errs || jsonb_build_object('field', 'metadata', 'message',
                'is ' || octet_length(nq_json_canonical(v)) || ' bytes as JSON; the limit is {{limit:MAX_METADATA_BYTES}}');
        END IF;
    END IF;
    v := p -> 'idempotencyKey';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF jsonb_typeof(v) <> 'string' THEN
            errs := errs || jsonb_build_object('field', 'idempotencyKey',
                                               'message', 'Input should be a valid string');
        ELSIF (v #>> '{}') !~ '{{limit:IDEMPOTENCY_KEY_PATTERN}}' THEN
            errs := errs || jsonb_build_object('field', 'idempotencyKey', 'message', key_message);
        END IF;
    END IF;
    -- digest: services.validation.DigestRequest's fields in its order, then its extras.
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
            ELSIF (v ->> 'key') !~ '{{limit:IDEMPOTENCY_KEY_PATTERN}}' THEN
                errs := errs || jsonb_build_object('field', 'digest.key', 'message', key_message);
            END IF;
            IF NOT v ? 'windowSeconds' THEN
                errs := errs || jsonb_build_object('field', 'digest.windowSeconds',
                                                   'message', 'Field required');
            ELSE
                t := nq_digest_int_error(v -> 'windowSeconds', 1, {{limit:MAX_DIGEST_WINDOW_SECONDS}});
                IF t IS NOT NULL THEN
                    errs := errs || jsonb_build_object('field', 'digest.windowSeconds', 'message', t);
                END IF;
            END IF;
            IF v ? 'maxItems' THEN
                t := nq_digest_int_error(v -> 'maxItems', {{limit:MIN_DIGEST_ITEMS}}, {{limit:MAX_DIGEST_ITEMS}});
                IF t IS NOT NULL THEN
                    errs := errs || jsonb_build_object('field', 'digest.maxItems', 'message', t);
                END IF;
            END IF;
            IF COALESCE(v -> 'template', 'null') <> 'null' THEN
                IF jsonb_typeof(v -> 'template') <> 'string' THEN
                    errs := errs || jsonb_build_object('field', 'digest.template',
                                                       'message', 'Input should be a valid string');
                ELSIF (v ->> 'template') !~ '{{limit:TEMPLATE_NAME_PATTERN}}' THEN
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
        errs := errs || jsonb_build_object('field', t,
                                           'message', nq_unknown_field_message(t, allowed));
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
            -- digest, as the model's check after the others.
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
