-- The one place that turns status changes into webhook events (docs/webhooks.md), called from
-- every statement that moves notifications to a reported status (completion, lease recovery,
-- expiry) inside that same statement, so the event commits or rolls back with the change.
-- Takes arrays from the caller's UPDATE ... RETURNING rather than re-reading the table: a function
-- called from a statement would not see that statement's own updates.
CREATE FUNCTION nq_insert_webhook_events(
    p_ids uuid[], p_statuses text[], p_attempts integer[], p_urls text[], p_policies text[],
    p_default_url text
) RETURNS integer
LANGUAGE sql VOLATILE AS $$
    WITH changed AS (
        SELECT gen_random_uuid() AS event_id, c.id, c.status, c.attempts,
               COALESCE(c.url, p.webhook_url, p_default_url) AS url,
               p.name AS policy
        FROM unnest(p_ids, p_statuses, p_attempts, p_urls, p_policies)
             AS c(id, status, attempts, url, policy)
        LEFT JOIN nq_policies p ON p.name = c.policy
        WHERE c.status IN ('SENT', 'FAILED', 'DEAD_LETTERED', 'EXPIRED')
    ), inserted AS (
        INSERT INTO nq_webhook_events (id, notification_id, url, policy, payload)
        SELECT c.event_id, c.id, c.url, c.policy,
               json_build_object(
                   'eventId', c.event_id,
                   'jobId', c.id,
                   'status', c.status,
                   'attemptCount', c.attempts,
                   'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
               )::text
        FROM changed c
        WHERE c.url IS NOT NULL
        RETURNING 1
    )
    SELECT count(*)::integer FROM inserted
$$;
