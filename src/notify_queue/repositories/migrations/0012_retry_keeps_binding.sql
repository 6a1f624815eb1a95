-- An operator's retry keeps the provider binding (issue 19; docs/providers.md "Failover and the
-- cost of a duplicate"). A notification dead-lettered or failed while bound to a provider whose
-- outcome is unknown (its last attempt timed out, or its worker died during the call) may have
-- been delivered there; retried unbound while that provider's circuit is open, it would go to the
-- next provider and be delivered twice. So the retry carries bound_provider (0009) into the queue
-- with the rest of the row, and the next attempt goes to the same provider under
-- OnDefiniteFailure.
--
-- Expand-only: the same function, signature and behaviour as 0011's (which 0.1.0's API and
-- 0.2.0's both call), plus one column copied. It must come after 0011, which defined the version
-- this one extends.
CREATE OR REPLACE FUNCTION nq_delivery_log_retry(p_ids uuid[]) RETURNS SETOF nq_queue
LANGUAGE sql VOLATILE AS $$
    WITH held AS (
        SELECT l.id, l.idempotency_key FROM nq_delivery_log l
        WHERE l.id = ANY(p_ids) AND l.status IN ('FAILED', 'DEAD_LETTERED')
        ORDER BY l.id
        FOR UPDATE
    ), keyed AS (
        -- A key deleted by a forget chunk that committed while this waited is skipped by the
        -- lock (READ COMMITTED), so its row is not moved.
        SELECT h.id FROM held h
        JOIN nq_idempotency_keys k ON k.key = h.idempotency_key AND k.notification_id = h.id
        FOR KEY SHARE OF k
    ), moved AS (
        DELETE FROM nq_delivery_log
        WHERE id = ANY(ARRAY(SELECT id FROM keyed)) AND status IN ('FAILED', 'DEAD_LETTERED')
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
           template_name, template_version, provider, delivery_attempts, bound_provider
    FROM moved
    RETURNING *
$$;
