-- nq_claim's answer, each admitted row with the suppression list's reason for its address
-- (`suppressed`, NULL when it is not on the list; docs/receipts.md): the send-time check of the
-- suppression list is one primary-key probe per admitted row inside the claim's statement, not
-- a read of its own. The rows keep nq_claim's order (a subquery per row, no join to reorder).
CREATE OR REPLACE FUNCTION nq_claim_v2(
    p_priorities smallint[], p_channels text[], p_limit integer, p_claim_token uuid,
    p_rate_limit integer, p_rate_window_seconds float8, p_lease_seconds float8,
    p_backoff_base_seconds float8, p_backoff_max_seconds float8, p_chain_channels text[],
    p_chain_heads text[], p_known_providers text[], p_webhook_url text,
    p_ids uuid[] DEFAULT NULL, p_quiet_ids uuid[] DEFAULT '{}')
RETURNS TABLE (
    screen boolean, deferred_channels text[], status_writes_noted integer,
    escalation_steps_stopped integer,
    id uuid, channel text, recipient text, subject text, body text, metadata jsonb,
    attempt_count integer, max_attempts integer, priority smallint,
    backoff_base_seconds float8, backoff_max_seconds float8, failover text, providers text[],
    category text, expires_at timestamptz, recipient_id text, recipient_exists boolean,
    timezone text, opt_out_all boolean, opt_out_channels text[], opt_out_categories text[],
    quiet_start time, quiet_end time, bound_provider text, sticky_provider text,
    next_attempt_at timestamptz, created_at timestamptz, send_at timestamptz,
    traceparent text, digest_id uuid, digest_bucket smallint, suppressed text)
LANGUAGE sql VOLATILE
SET enable_seqscan = off
AS $$
SELECT c.*,
       (SELECT s.reason FROM nq_suppressions s
        WHERE s.tenant = 'default' AND s.channel = c.channel
          AND s.address = nq_normalised_address(c.channel, c.recipient)) AS suppressed
FROM nq_claim(p_priorities, p_channels, p_limit, p_claim_token, p_rate_limit,
              p_rate_window_seconds, p_lease_seconds, p_backoff_base_seconds,
              p_backoff_max_seconds, p_chain_channels, p_chain_heads, p_known_providers,
              p_webhook_url, p_ids, p_quiet_ids) AS c
$$;
