-- The drain's cost per notification (docs/performance.md), expand step: functions replaced in place
-- with the same arguments and results.
--
-- nq_attempts_append: source code now, functions/nq_attempts_append.sql.

-- nq_finish (0012) with one change: the webhook events are written by a call only when one of
-- the finished rows can have an event, that is when a URL can apply to it (its own
-- `webhook_url`, its policy's, or the worker's default). Without any, nq_insert_webhook_events
-- inserts nothing, yet its statement (a join with the policies and a uuid per row) ran for every
-- completion, expiry and cancel. Everything else is 0012's body, as 0.1.0's move trigger and
-- 0.2.0's callers use it.
CREATE OR REPLACE FUNCTION nq_finish(
    p_ids uuid[], p_statuses text[], p_last_errors text[], p_attempt_counts integer[],
    p_provider_message_ids text[], p_providers text[], p_delivery_attempts jsonb[],
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
        SELECT * FROM unnest(p_ids, p_statuses, p_last_errors, p_attempt_counts,
                             p_provider_message_ids, p_providers, p_delivery_attempts)
            AS g(id, status, last_error, attempt_count, provider_message_id, provider,
                 delivery_attempts)
    ), moved AS (
        DELETE FROM nq_jobs j USING given g
        WHERE j.id = ANY(p_ids) AND j.id = g.id
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
        -- per completion of a deployment without webhooks (0023).
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

-- The claim's UPDATE of a queue row cannot be HOT (it changes `status`, which the partial
-- indexes' predicates read), but when the new version fits on the old one's page its WAL record
-- carries only the bytes between the first and the last changed column: the claim changes
-- status, the attempt, the token, the lease, the provider and `updated_at`, and leaves the
-- recipient, subject and body (most of the row) alone. Filled to 100% by a burst of creates,
-- 69% of the claims' new versions went to another page (the benchmark's `newpage_upd`) and
-- logged whole. 30% of each page is kept free for them: about 150 B less WAL per notification
-- (docs/performance.md), for a backlog that takes 1.4x the pages while it waits. Only pages
-- filled from now on; the lock (SHARE UPDATE EXCLUSIVE) lets claims and creates go on.
ALTER TABLE nq_jobs SET (fillfactor = 70);
