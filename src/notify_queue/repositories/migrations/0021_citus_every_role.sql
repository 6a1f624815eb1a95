-- Notify Queue on Citus, the rest of issue 21 (docs/scaling.md "Citus: every role"), expand step.
--
-- 1. notify_queue_enqueue (0016) reads an idempotency key's row in two statements, the key first
--    and then the row by id: the same answers and the same two index probes on a single server;
--    on Citus the one statement was refused (a subquery of the keys, distributed by key, inside a
--    read of the view over the queue and the log, distributed by bucket). Only the two reads
--    change; the function keeps its arguments, result, grants and search_path.
-- 2. nq_delivery_log_forget_keys_unlocked: retention's key cleanup for Citus, where the
--    partition's rows cannot be locked (FOR KEY SHARE runs only in a query on one shard) in the
--    statement that deletes keys from another distribution. A plain PostgreSQL database never
--    calls it (repositories/delivery_log.py chooses by the engine).

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
        'category', v_category, 'recipient_id', request ->> 'recipientId');

    IF request ->> 'recipientId' IS NULL THEN
        -- An address: one notification under the key itself.
        PERFORM FROM nq_insert_notifications(
            jsonb_build_array(base || jsonb_build_object(
                'position', 0, 'id', gen_random_uuid(), 'idempotency_key', v_key,
                'channel', request ->> 'channel', 'recipient', request ->> 'recipient'))::json,
            v_max_attempts, v_webhook_url) i;
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
    keys := ARRAY[v_key, v_key || ' email', v_key || ' sms', v_key || ' push', v_key || ' suppressed'];
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
    ids := ARRAY(SELECT i.id FROM nq_insert_notifications(items::json, v_max_attempts, v_webhook_url) i);
    IF cardinality(chosen) > 0 THEN
        PERFORM pg_notify('nq_wakeup', '');
    END IF;
    SELECT jsonb_agg(nq_notification_json(n) ORDER BY array_position(ids, n.id)) INTO answer
    FROM nq_all_notifications n WHERE n.id = ANY(ids);
    RETURN jsonb_build_object('notifications', answer);
END $$;

-- CREATE OR REPLACE resets the function's SET clause: the search_path of 0016 again.
DO $$
BEGIN
    EXECUTE 'ALTER FUNCTION notify_queue_enqueue(jsonb, text) SET search_path = '
            || quote_ident(current_schema()) || ', pg_temp';
END $$;

-- nq_delivery_log_forget_keys (0011) without the lock on the partition's rows. What the lock
-- kept: a retry that moves a row of an expired partition back to the queue while its key is
-- being forgotten keeps the row and loses the key. On Citus that race is left open (a retry of
-- a notification older than the retention, during the minute its partition is dropped); the
-- chunks and their order are those of 0011.
CREATE FUNCTION nq_delivery_log_forget_keys_unlocked(p_partition text, p_after uuid,
                                                     p_limit integer)
RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    last_id uuid;
    chunk_ids uuid[];
    chunk_keys text[];
BEGIN
    -- Two statements: the chunk of the partition (by bucket) read first, then its keys (by key)
    -- deleted; Citus plans no DELETE of one distribution joined to a CTE over another.
    EXECUTE
        'SELECT array_agg(id ORDER BY id), array_agg(idempotency_key ORDER BY id) FROM'
        || ' (SELECT id, idempotency_key FROM ' || quote_ident(p_partition)
        || '  WHERE id > $1 ORDER BY id LIMIT $2) c'
    INTO chunk_ids, chunk_keys USING p_after, p_limit;
    IF chunk_ids IS NULL THEN
        RETURN NULL;
    END IF;
    DELETE FROM nq_idempotency_keys k
    WHERE k.key = ANY(chunk_keys)
      AND (k.key, k.notification_id) IN (SELECT * FROM unnest(chunk_keys, chunk_ids));
    last_id := chunk_ids[cardinality(chunk_ids)];
    RETURN last_id;
END $$;
