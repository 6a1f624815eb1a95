-- Move rows that end (SENT, FAILED, DEAD_LETTERED, CANCELLED, EXPIRED, SUPPRESSED) from the queue
-- into the log: the log row, the status counters, the operator's status write for Kubernetes rows,
-- a webhook event when a URL can apply. p_claim_tokens: per row, the claim it must still hold
-- (PROCESSING under that token) to move, so a late result moves nothing; NULL for a row the
-- caller holds by a lock of its own (a cancel, an expiry, a digest's items after their carrier),
-- or a NULL array for all of them. A NULL array of any other argument keeps the rows' own values.
CREATE OR REPLACE FUNCTION nq_finish_held(
    p_ids uuid[], p_claim_tokens uuid[], p_statuses text[], p_last_errors text[],
    p_attempt_counts integer[], p_provider_message_ids text[], p_providers text[],
    p_delivery_attempts jsonb[],
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
        SELECT * FROM unnest(p_ids, p_claim_tokens, p_statuses, p_last_errors,
                             p_attempt_counts, p_provider_message_ids, p_providers,
                             p_delivery_attempts)
            AS g(id, claim_token, status, last_error, attempt_count, provider_message_id,
                 provider, delivery_attempts)
    ), moved AS (
        DELETE FROM nq_jobs j USING given g
        WHERE j.id = ANY(p_ids) AND j.id = g.id
          AND (g.claim_token IS NULL
               OR (j.claim_token = g.claim_token AND j.status = 'PROCESSING'))
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
        -- Called only when an event can have a URL (the row's, its policy's or the default):
        -- without any, nq_insert_webhook_events inserts nothing, and the call cost a statement
        -- per completion of a deployment without webhooks.
        SELECT nq_insert_webhook_events(array_agg(l.id), array_agg(l.status),
                                        array_agg(l.attempt_count), array_agg(l.webhook_url),
                                        array_agg(l.policy), p_default_webhook_url,
                                        array_agg(l.provider), array_agg(l.bucket)) AS n
        FROM logged l WHERE p_note
        HAVING p_default_webhook_url IS NOT NULL
            OR bool_or(l.webhook_url IS NOT NULL OR l.policy IS NOT NULL)
    )
    -- noted and events are read so that they run (a SELECT in WITH runs only when referenced).
    SELECT l.id, l.status, l.attempt_count, l.source, l.channel, l.recipient, l.recipient_id,
           l.bucket, l.webhook_url, l.policy, l.provider
    FROM logged l
    WHERE (SELECT n FROM noted) IS NOT DISTINCT FROM (SELECT n FROM noted)
      AND (SELECT n FROM events) IS NOT DISTINCT FROM (SELECT n FROM events);
END $$;
