-- Webhook events carry their notification's bucket (issue 21, docs/scaling.md), expand step.
--
-- On Citus the events live beside their notification: distributed by `bucket`, co-located with
-- nq_jobs and the log, so the relay's claim (FOR UPDATE SKIP LOCKED) names one bucket and routes
-- to one shard. The column is nullable: 0.1.0 still inserts events (through
-- nq_insert_webhook_events with 6 or 7 arguments) and never reads the column; on a single server
-- nothing reads it either. `migrate` on a Citus coordinator fills the missing ones and makes it
-- part of the primary key (repositories/citus_layout.sql) before it distributes the table.

-- A new nullable column: 0.1.0 never reads webhook events with `*`.
ALTER TABLE nq_webhook_events ADD COLUMN bucket smallint;

-- A second function of the same name with p_buckets (one bucket per notification, as p_ids),
-- every argument required, which every 0.2.0 caller passes. The 0.1.0 one (7 arguments, the
-- last with a default) stays as it is: 0.1.0 calls it with 6 or 7 arguments, which resolve to it
-- and never to this one (8), so neither call is ambiguous. It is not dropped and created again:
-- a function is not locked by its callers, so a 0.1.0 statement planned before such a migration
-- committed fails at execution with "cache lookup failed for function" (the rolling-upgrade test
-- saw it on 0.1.0's create). The 0.1.0 function goes in a later release's contract step.
CREATE FUNCTION nq_insert_webhook_events(
    p_ids uuid[], p_statuses text[], p_attempts integer[], p_urls text[], p_policies text[],
    p_default_url text, p_providers text[], p_buckets smallint[]
) RETURNS integer
LANGUAGE sql VOLATILE AS $$
    WITH changed AS (
        SELECT gen_random_uuid() AS event_id, c.id, c.status, c.attempts, c.provider, c.bucket,
               COALESCE(c.url, p.webhook_url, p_default_url) AS url,
               p.name AS policy
        -- A multi-argument unnest pads shorter arrays with NULLs: callers without providers
        -- (expiry, lease recovery) pass none, 0.1.0 passes no buckets.
        FROM unnest(p_ids, p_statuses, p_attempts, p_urls, p_policies, p_providers, p_buckets)
             AS c(id, status, attempts, url, policy, provider, bucket)
        LEFT JOIN nq_policies p ON p.name = c.policy
        WHERE c.status IN ('SENT', 'FAILED', 'DEAD_LETTERED', 'EXPIRED', 'SUPPRESSED')
    ), inserted AS (
        INSERT INTO nq_webhook_events (id, notification_id, url, policy, payload, bucket)
        SELECT c.event_id, c.id, c.url, c.policy,
               json_build_object(
                   'eventId', c.event_id,
                   'jobId', c.id,
                   'status', c.status,
                   'attemptCount', c.attempts,
                   'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                   'provider', c.provider
               )::text,
               c.bucket
        FROM changed c
        WHERE c.url IS NOT NULL
        RETURNING 1
    )
    SELECT count(*)::integer FROM inserted
$$;

-- The move into the log (0012) passes each notification's bucket to its webhook event; the
-- rest is unchanged.
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
        SELECT nq_insert_webhook_events(array_agg(l.id), array_agg(l.status),
                                        array_agg(l.attempt_count), array_agg(l.webhook_url),
                                        array_agg(l.policy), p_default_webhook_url,
                                        array_agg(l.provider), array_agg(l.bucket)) AS n
        FROM logged l WHERE p_note
    )
    -- noted and events are read so that they run (a SELECT in WITH runs only when referenced).
    SELECT l.id, l.status, l.attempt_count, l.source, l.channel, l.recipient, l.recipient_id,
           l.bucket, l.webhook_url, l.policy, l.provider
    FROM logged l
    WHERE (SELECT n FROM noted) IS NOT DISTINCT FROM (SELECT n FROM noted)
      AND (SELECT n FROM events) IS NOT DISTINCT FROM (SELECT n FROM events);
END $$;
