-- Enqueue in the caller's transaction (docs/enqueue.md): one POST /notifications body and its
-- idempotency key, validated and answered as the API does; the workers are woken at its commit.
CREATE OR REPLACE FUNCTION notify_queue_enqueue(request jsonb, idempotency_key text) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    errs jsonb;
    v_key text;
    v_hash text;
    v_max_attempts integer := (SELECT d.max_attempts FROM nq_enqueue_defaults d);
    v_webhook_url text := (SELECT d.webhook_url FROM nq_enqueue_defaults d);
    v_send_at timestamptz;
    v_expires_at timestamptz;
    keys text[];
    stored nq_all_notifications;
    v_stored_hash text;
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
    -- work itself. Set here, not as the function's SET clause, which a migrating user who
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
        -- digest: joined by nq_insert_digest_items, as the API's creates are.
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
        SELECT k.notification_id, nq_stored_hash(k.request_digest, k.request_hash)
        INTO v_id, v_stored_hash
        FROM nq_idempotency_keys k WHERE k.key = v_key;
        SELECT n.* INTO stored FROM nq_all_notifications n WHERE n.id = v_id;
        IF v_stored_hash <> left(v_hash, 32) THEN
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
             v_key || ' chat', v_key || ' webhook', v_key || ' incident', v_key || ' suppressed'];
    IF EXISTS (SELECT 1 FROM nq_idempotency_keys k WHERE k.key = ANY(keys)) THEN
        ids := ARRAY(SELECT k.notification_id FROM nq_idempotency_keys k WHERE k.key = ANY(keys));
        ids := ARRAY(SELECT n.id FROM nq_all_notifications n WHERE n.id = ANY(ids)
                     ORDER BY array_position(keys, n.idempotency_key));
        IF (SELECT bool_or(nq_stored_hash(k.request_digest, k.request_hash) <> left(v_hash, 32)
                           OR k.key = v_key)
            FROM nq_idempotency_keys k WHERE k.key = ANY(keys)) THEN
            RAISE EXCEPTION USING ERRCODE = 'unique_violation',
                MESSAGE = 'idempotency key ' || quote_literal(v_key)
                          || ' was already used with a different request, by notification '
                          || ids[1];
        END IF;
        RETURN jsonb_build_object('notifications', (
            SELECT jsonb_agg(nq_notification_json(n) ORDER BY array_position(ids, n.id))
            FROM nq_all_notifications n WHERE n.id = ANY(ids)));
    END IF;
    SELECT r.*, v.voice, d.chat, d.webhook, d.incident INTO recipient FROM nq_recipients r
    LEFT JOIN nq_recipient_voices v ON v.recipient_id = r.id
    LEFT JOIN nq_recipient_destinations d ON d.recipient_id = r.id
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
                          WHEN 'chat' THEN recipient.chat WHEN 'webhook' THEN recipient.webhook
                          WHEN 'incident' THEN recipient.incident
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
                          WHEN 'chat' THEN recipient.chat WHEN 'webhook' THEN recipient.webhook
                          WHEN 'incident' THEN recipient.incident
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
    -- The answer lists them in the order of the request's channels, which the insert's rows
    -- (a data-modifying CTE) do not keep.
    ids := ARRAY(SELECT (t.e ->> 'id')::uuid FROM jsonb_array_elements(items) WITH ORDINALITY t(e, o)
                 WHERE (t.e ->> 'id')::uuid = ANY(ids) ORDER BY t.o);
    IF cardinality(chosen) > 0 THEN
        PERFORM pg_notify('nq_wakeup', '');
    END IF;
    SELECT jsonb_agg(nq_notification_json(n) ORDER BY array_position(ids, n.id)) INTO answer
    FROM nq_all_notifications n WHERE n.id = ANY(ids);
    RETURN jsonb_build_object('notifications', answer);
END $$;

-- Only the roles it is granted to (`migrate` grants notify_queue_enqueue); it runs as its owner
-- on this schema's objects whatever the caller's search_path.
REVOKE EXECUTE ON FUNCTION notify_queue_enqueue(jsonb, text) FROM PUBLIC;
DO $$
BEGIN
    EXECUTE 'ALTER FUNCTION notify_queue_enqueue(jsonb, text) SET search_path = '
            || quote_ident(current_schema()) || ', pg_temp';
END $$;
