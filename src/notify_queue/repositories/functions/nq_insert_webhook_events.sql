-- The webhook events of notifications that reached a final status; the number written.
CREATE OR REPLACE FUNCTION nq_insert_webhook_events(
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
               nq_webhook_payload(c.event_id, c.id, c.status, c.attempts, c.provider), c.bucket
        FROM changed c
        WHERE c.url IS NOT NULL
        RETURNING 1
    )
    SELECT count(*)::integer FROM inserted
$$;
