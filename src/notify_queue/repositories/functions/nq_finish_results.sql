-- nq_finish_results takes the worker's results as they come (one entry per result, a PENDING
-- one skipped: the statement retries those), and works each final value out in the RETURNING of
-- its DELETE, from the row the DELETE has just locked and checked. A row moves only while it is
-- PROCESSING under the result's claim token: the DELETE names the token, so a late result (its
-- lease recovered, claimed again) matches nothing, as with nq_finish_held's tokens.
--
-- A digest's carrier (docs/digests.md) ends its digest: the digest's PENDING items are locked
-- after their carrier (the carrier by this DELETE, the items by `items`, in id order: the order
-- every writer of a closed digest's items uses) and moved with the carrier's status, error,
-- attempt count, provider message id, provider and attempt log, each with its own log row and
-- webhook event. A batch without a carrier reads no item.
--
-- The move is nq_finish_held's: the log row, the status counters, the operator's status write
-- for Kubernetes rows, and a webhook event when a URL can apply (the row's, its policy's, or the
-- default), all in this statement.
CREATE OR REPLACE FUNCTION nq_finish_results(
    p_ids uuid[], p_claim_tokens uuid[], p_statuses text[], p_last_errors text[],
    p_give_back boolean[], p_provider_message_ids text[], p_providers text[],
    p_bound_providers text[], p_attempts jsonb, p_default_webhook_url text
) RETURNS {{_finished_rows}}
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    PERFORM nq_delivery_log_ready();
    RETURN QUERY
    WITH given AS (
        SELECT * FROM unnest(p_ids, p_claim_tokens, p_statuses, p_last_errors, p_give_back,
                             p_provider_message_ids, p_providers, p_bound_providers)
            WITH ORDINALITY AS g(id, claim_token, status, last_error, give_back,
                                 provider_message_id, provider, bound_provider, position)
        WHERE g.status <> 'PENDING'
    ), carried AS (
        DELETE FROM nq_jobs j USING given g
        WHERE j.id = ANY(p_ids) AND j.id = g.id AND j.claim_token = g.claim_token
          -- PROCESSING, in a form that is not the lease index's predicate (nq_jobs_lease): the
          -- plan kept per connection, made on a young queue's statistics, would read every
          -- PROCESSING row through that index and filter them by id (tests/test_drain_plans.py).
          -- A result always has a token, so the OR changes the plan and nothing else.
          AND (j.status = 'PROCESSING' OR g.claim_token IS NULL)
        RETURNING j.*, g.status AS final_status, g.last_error AS final_last_error,
                  j.attempt_count - CASE WHEN g.give_back THEN 1 ELSE 0 END AS final_attempt_count,
                  COALESCE(g.provider_message_id, j.provider_message_id)
                      AS final_provider_message_id,
                  -- A SENT row's provider is the one that sent it; any other keeps the binding
                  -- the worker reports (the provider whose outcome is unknown, else none).
                  CASE WHEN g.status = 'SENT' THEN g.provider ELSE g.bound_provider END
                      AS final_provider,
                  -- The attempts come as one JSON array of arrays, by the results' position.
                  nq_attempts_append(j.delivery_attempts, p_attempts -> (g.position::integer - 1))
                      AS final_delivery_attempts
    ), items AS (
        -- [digests] Through nq_jobs_digest, only for a carrier: none in most batches.
        SELECT n.id, c.final_status, c.final_last_error, c.final_attempt_count,
               c.final_provider_message_id, c.final_provider, c.final_delivery_attempts
        FROM carried c
        JOIN nq_jobs n ON n.bucket = c.bucket AND n.digest_id = c.digest_id
        WHERE c.digest_id IS NOT NULL AND n.id <> c.id AND n.status = 'PENDING'
        ORDER BY n.id
        FOR UPDATE OF n
    ), itemised AS (
        -- No status check here: the items are locked above, PENDING, and stay so. A check of
        -- `status = 'PENDING'` would be the predicate of the queue's PENDING indexes, and the plan
        -- kept per connection, made on a young queue's statistics, read every PENDING row
        -- through one of them on every completion (tests/test_drain_plans.py).
        DELETE FROM nq_jobs j USING items i
        WHERE j.id = i.id
        RETURNING j.*, i.final_status, i.final_last_error, i.final_attempt_count,
                  i.final_provider_message_id, i.final_provider, i.final_delivery_attempts
    ), moved AS (
        SELECT * FROM carried
        UNION ALL
        SELECT * FROM itemised
    ), logged AS (
        {{_log_moved}}
    ), counted AS (
        -- The status counters by final status: PENDING and PROCESSING are not counted,
        -- so the rows' previous status subtracts nothing. One call for the batch (`IS NULL`:
        -- nq_count returns void, which the comparison below cannot read).
        SELECT nq_count('notifications', NULL, array_agg(m.final_status),
                        '{PENDING,PROCESSING}') IS NULL AS n
        FROM moved m WHERE m.source <> 'kubernetes'
        HAVING count(*) > 0
    ), noted AS (
        -- Kubernetes rows: counted and given their status write (nq_note_changes), only when
        -- the batch has some.
        SELECT nq_note_changes(array_agg(m.id), array_agg(m.source), array_agg(m.status),
                               array_agg(m.final_status)) AS n
        FROM moved m WHERE m.source = 'kubernetes'
        HAVING count(*) > 0
    ), events AS (
        -- Called only when an event can have a URL (as nq_finish_held).
        SELECT nq_insert_webhook_events(array_agg(l.id), array_agg(l.status),
                                        array_agg(l.attempt_count), array_agg(l.webhook_url),
                                        array_agg(l.policy), p_default_webhook_url,
                                        array_agg(l.provider), array_agg(l.bucket)) AS n
        FROM logged l
        HAVING p_default_webhook_url IS NOT NULL
            OR bool_or(l.webhook_url IS NOT NULL OR l.policy IS NOT NULL)
    )
    -- counted, noted and events are read so that they run (a SELECT in WITH runs only when
    -- referenced).
    SELECT l.id, l.status, l.attempt_count, l.source, l.channel, l.recipient, l.recipient_id,
           l.bucket, l.webhook_url, l.policy, l.provider
    FROM logged l
    WHERE (SELECT n FROM counted) IS NOT DISTINCT FROM (SELECT n FROM counted)
      AND (SELECT n FROM noted) IS NOT DISTINCT FROM (SELECT n FROM noted)
      AND (SELECT n FROM events) IS NOT DISTINCT FROM (SELECT n FROM events);
END $$;
