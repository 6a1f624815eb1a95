-- The provider a notification's attempt is bound to (issue 19, item 5; docs/providers.md
-- "Failover and the cost of a duplicate").
--
-- Before a provider is called, the row says which one: the claim binds it to the head of its
-- chain (in the claim's own UPDATE), and a delivery that calls another provider writes that one
-- first. So when the outcome of the call is unknown (a timeout, a worker killed during the call,
-- a result that could not be recorded before the lease ran out) the row still names the only
-- provider that may have delivered it, and under OnDefiniteFailure it is sent nowhere else. A
-- completion keeps the binding only while an attempt's outcome there is unknown; a provider's
-- answer that proves nothing was sent, or no call at all, clears it.
--
-- Expand-only: a nullable column, metadata only, no rewrite. NULL means "no binding": what
-- 0.1.0 workers leave (they neither read nor write it). The delivery log gets the column too,
-- at the same position, because the move trigger copies a finished row with `SELECT *`.
ALTER TABLE nq_queue ADD COLUMN bound_provider text;
ALTER TABLE nq_delivery_log ADD COLUMN bound_provider text;
-- The reading view shows it (a view may gain columns at its end; readers use names).
CREATE OR REPLACE VIEW nq_notifications AS
    SELECT * FROM nq_queue
    UNION ALL
    SELECT * FROM nq_delivery_log;

-- An operator's retry of a FAILED or DEAD_LETTERED notification moves it back to the queue with
-- its binding: a notification dead-lettered after a crash during its final re-check may have
-- been delivered by that provider. The same function as in 0008 plus the new last column; its
-- callers (0.1.0's included) read its rows by column name, so one more column changes nothing.
CREATE OR REPLACE FUNCTION nq_delivery_log_retry(p_ids uuid[]) RETURNS SETOF nq_queue
LANGUAGE sql VOLATILE AS $$
    WITH moved AS (
        DELETE FROM nq_delivery_log
        WHERE id = ANY(p_ids) AND status IN ('FAILED', 'DEAD_LETTERED')
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
