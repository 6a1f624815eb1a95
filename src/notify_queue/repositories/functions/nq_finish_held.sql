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
) RETURNS {{_finished_rows}}
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_ids uuid[]; v_statuses text[]; v_counts integer[]; v_sources text[]; v_channels text[];
    v_recipients text[]; v_recipient_ids text[]; v_buckets smallint[]; v_urls text[];
    v_policies text[]; v_providers text[];
    v_moved uuid[]; v_moved_sources text[]; v_old text[]; v_final text[];
BEGIN
    -- Today's partition of the log exists, in a statement before the move that writes to it.
    PERFORM nq_delivery_log_ready();

    -- Move: the rows deleted from the queue (those a claim token names only while that claim
    -- holds them) and inserted into the log with their final values.
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
        RETURNING j.*, {{_final_values}}
    ), logged AS (
        {{_log_moved}}
    )
    SELECT array_agg(l.id), array_agg(l.status), array_agg(l.attempt_count), array_agg(l.source),
           array_agg(l.channel), array_agg(l.recipient), array_agg(l.recipient_id),
           array_agg(l.bucket), array_agg(l.webhook_url), array_agg(l.policy),
           array_agg(l.provider),
           (SELECT array_agg(m.id) FROM moved m), (SELECT array_agg(m.source) FROM moved m),
           (SELECT array_agg(m.old_status) FROM moved m),
           (SELECT array_agg(m.final_status) FROM moved m)
    INTO v_ids, v_statuses, v_counts, v_sources, v_channels, v_recipients, v_recipient_ids,
         v_buckets, v_urls, v_policies, v_providers, v_moved, v_moved_sources, v_old, v_final
    FROM logged l;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;

    IF p_note THEN
        -- The status counters, and the operator's status write for Kubernetes rows.
        PERFORM nq_note_changes(v_moved, v_moved_sources, v_old, v_final);
        -- Webhook events, only when one can have a URL (the row's, its policy's or the default).
        IF p_default_webhook_url IS NOT NULL
           OR EXISTS (SELECT 1 FROM unnest(v_urls, v_policies) AS u(url, policy)
                      WHERE u.url IS NOT NULL OR u.policy IS NOT NULL) THEN
            PERFORM nq_insert_webhook_events(v_ids, v_statuses, v_counts, v_urls, v_policies,
                                             p_default_webhook_url, v_providers, v_buckets);
        END IF;
    END IF;

    -- The rows moved, with their final values.
    RETURN QUERY
    SELECT * FROM unnest(v_ids, v_statuses, v_counts, v_sources, v_channels, v_recipients,
                         v_recipient_ids, v_buckets, v_urls, v_policies, v_providers);
END $$;
