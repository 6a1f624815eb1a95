-- The previous release's claim (strict priority), called by its workers during a roll-out:
-- nq_claim_v2 without aging or the suppression reason. Dropped by a contract migration (docs/upgrading.md).
CREATE OR REPLACE FUNCTION nq_claim(
    p_priorities smallint[], p_channels text[], p_limit integer, p_claim_token uuid,
    p_rate_limit integer, p_rate_window_seconds float8, p_lease_seconds float8,
    p_backoff_base_seconds float8, p_backoff_max_seconds float8, p_chain_channels text[],
    p_chain_heads text[], p_known_providers text[], p_webhook_url text,
    p_ids uuid[] DEFAULT NULL, p_quiet_ids uuid[] DEFAULT '{}')
RETURNS TABLE (
    screen boolean, deferred_channels text[], status_writes_noted integer,
    escalation_steps_stopped integer,
    {{_claimed_columns}})
LANGUAGE sql VOLATILE
AS $$
    SELECT screen, deferred_channels, status_writes_noted, escalation_steps_stopped, id, channel,
           recipient, subject, body, metadata, attempt_count, max_attempts, priority,
           backoff_base_seconds, backoff_max_seconds, failover, providers, category, expires_at,
           recipient_id, recipient_exists, timezone, opt_out_all, opt_out_channels,
           opt_out_categories, quiet_start, quiet_end, bound_provider, sticky_provider,
           next_attempt_at, created_at, send_at, traceparent, digest_id, digest_bucket
    FROM nq_claim_v2(
        p_priorities, p_channels, p_limit, 0, p_claim_token, p_rate_limit, p_rate_window_seconds,
        p_lease_seconds, p_backoff_base_seconds, p_backoff_max_seconds, p_chain_channels,
        p_chain_heads, p_known_providers, p_webhook_url, p_ids, p_quiet_ids)
$$;
