-- Record a batch of results, in one round trip: the function carries the drain's plan settings,
-- so the worker calls it in autocommit. A result is accepted only from the holder of the
-- current claim token of a PROCESSING row: each write names the token (no lock first, no read
-- first), so a late result from a worker whose lease expired matches nothing and is dropped; its
-- id is absent from the answer.
-- - A final result (SENT, FAILED, DEAD_LETTERED, SUPPRESSED, EXPIRED) moves the row to the log
--   with nq_finish_results, given the results as they come: its DELETE works out each
--   final value from the row it locks (and a digest's carrier ends its items); the log row, the
--   counters, the operator's status write and the webhook event are all in this statement.
-- - A retry (PENDING after a temporary failure, with its backoff; or at the end of quiet hours,
--   an absolute next_attempt_at) updates the row, with the reason it waits.
-- The place in the recipient's window is kept when SENT and given back otherwise (nothing reached
-- the recipient). The attempt's provider calls are kept on the row (the last 20); when no
-- provider was tried (all open or rate-limited) the attempt the claim counted is given back
-- (give_back), as the send-time check does for what it suppresses, expires or defers.
-- A provider's 410 (address_gone) removes that push token from the stored recipient.
-- Each result says which provider the row stays bound to (kept in `provider`): the one whose
-- outcome is unknown, else NULL; a SENT row's `provider` is the one that sent it.
-- The attempts come as one JSON array of arrays, matched to the results by position: a jsonb[]
-- parameter would be dumped element by element with every quote escaped, the costliest part of
-- the statement's parameters on the worker's side.
CREATE OR REPLACE FUNCTION nq_complete_deliveries(
    p_ids uuid[], p_claim_tokens uuid[], p_statuses text[], p_retry_in_seconds float8[],
    p_last_errors text[], p_provider_message_ids text[], p_providers text[], p_attempts jsonb,
    p_give_back bool[], p_next_attempt_ats timestamptz[], p_addresses_gone bool[],
    p_bound_providers text[], p_waiting_reasons text[], p_waiting_details text[],
    p_default_webhook_url text)
RETURNS TABLE (accepted uuid[], events_possible boolean, noted integer)
{{_drain_function}}
#variable_conflict use_column
DECLARE
    v_accepted uuid[];
    v_events boolean;
    v_back_ids uuid[];
    v_back_buckets smallint[];
    v_back_recipients text[];
    v_gone_ids uuid[] := '{}';
    v_gone_recipient_ids text[];
    v_gone_tokens text[];
    v_retried uuid[];
    v_retried_sources text[];
    v_noted integer;
BEGIN
    -- The results whose provider said the push token is gone (410), if any.
    IF true = ANY(p_addresses_gone) THEN
        v_gone_ids := ARRAY(SELECT r.id FROM unnest(p_ids, p_addresses_gone) AS r(id, gone)
                            WHERE r.gone);
    END IF;

    -- Finals: the results that end, moved to the log as they came (nq_finish_results; a PENDING
    -- result is skipped there). What it moved tells the ids accepted, whether a webhook event may
    -- have been written (a row with a URL of its own, its policy's, or the default), the places
    -- to give back (nothing was sent) and the push tokens a provider answered 410 for.
    SELECT array_agg(f.id) FILTER (WHERE f.id = ANY(p_ids)),
           p_default_webhook_url IS NOT NULL
               OR bool_or(f.webhook_url IS NOT NULL OR f.policy IS NOT NULL),
           array_agg(f.id) FILTER (WHERE f.status <> 'SENT'),
           array_agg(f.bucket) FILTER (WHERE f.status <> 'SENT'),
           array_agg(f.recipient) FILTER (WHERE f.status <> 'SENT'),
           array_agg(f.recipient_id) FILTER (WHERE f.status <> 'SENT' AND f.channel = 'push'
                                                AND f.recipient_id IS NOT NULL
                                                AND f.id = ANY(v_gone_ids)),
           array_agg(f.recipient) FILTER (WHERE f.status <> 'SENT' AND f.channel = 'push'
                                             AND f.recipient_id IS NOT NULL
                                             AND f.id = ANY(v_gone_ids))
    INTO v_accepted, v_events, v_back_ids, v_back_buckets, v_back_recipients,
         v_gone_recipient_ids, v_gone_tokens
    FROM nq_finish_results(
        p_ids, p_claim_tokens, p_statuses, p_last_errors,
        p_give_back, p_provider_message_ids, p_providers,
        p_bound_providers, p_attempts, p_default_webhook_url) AS f;
    v_events := COALESCE(v_events, p_default_webhook_url IS NOT NULL);

    -- Retries: PENDING again with the reason they wait (only in a batch that has some).
    IF 'PENDING' = ANY(p_statuses) THEN
        WITH results AS (
            SELECT * FROM unnest(
                p_ids, p_claim_tokens, p_statuses,
                p_retry_in_seconds, p_last_errors,
                p_provider_message_ids, p_providers,
                p_give_back, p_next_attempt_ats, p_addresses_gone,
                p_bound_providers, p_waiting_reasons, p_waiting_details
            ) WITH ORDINALITY AS r(id, claim_token, status, retry_in_seconds, last_error,
                                   provider_message_id, provider, give_back, next_attempt_at,
                                   address_gone, bound_provider, waiting_reason, waiting_detail,
                                   position)
            WHERE r.status = 'PENDING'
        ), held AS MATERIALIZED (
            -- The retries' rows, through the primary key. Read without a lock: while a row is
            -- PROCESSING under a token only its holder changes it, and `retried` names the token
            -- (a row whose claim moved on is re-read by it and left alone). The status is checked
            -- in `accepted`, not here: `status = 'PROCESSING'` is the lease index's predicate, and
            -- a generic plan made on a young queue read every PROCESSING row through that index
            -- (tests/test_drain_plans.py). MATERIALIZED for the same reason.
            SELECT n.id, n.status, n.claim_token, n.attempt_count, n.provider_message_id,
                   n.delivery_attempts, n.next_attempt_at
            FROM nq_jobs n
            WHERE n.id = ANY(ARRAY(SELECT id FROM results WHERE status = 'PENDING'))
        ), accepted AS MATERIALIZED (
            -- MATERIALIZED: inlined into `retried`, its status check and `retried`'s would make the
            -- planner derive the lease index's predicate for the queue's scan.
            SELECT r.*, h.status AS held_status,
                   h.attempt_count - CASE WHEN r.give_back THEN 1 ELSE 0 END AS final_attempt_count,
                   COALESCE(r.provider_message_id, h.provider_message_id)
                       AS final_provider_message_id,
                   nq_attempts_append(h.delivery_attempts, p_attempts -> (r.position::integer - 1))
                       AS final_delivery_attempts,
                   COALESCE(r.next_attempt_at, now() + make_interval(secs => r.retry_in_seconds),
                            h.next_attempt_at) AS final_next_attempt_at
            FROM results r
            JOIN held h ON h.id = r.id AND h.claim_token = r.claim_token AND h.status = 'PROCESSING'
            WHERE r.status = 'PENDING'
        ), retried AS (
            UPDATE nq_jobs n
            SET status = 'PENDING',
                next_attempt_at = a.final_next_attempt_at,
                last_error = a.last_error,
                provider_message_id = a.final_provider_message_id,
                -- A retry stays bound to the provider whose outcome is unknown, else to none.
                provider = a.bound_provider,
                delivery_attempts = a.final_delivery_attempts,
                attempt_count = a.final_attempt_count,
                claim_token = NULL,
                lease_expires_at = NULL,
                waiting_reason = a.waiting_reason,
                waiting_until = a.final_next_attempt_at,
                -- The worker words what only it knows (CircuitOpen, ProviderRateLimit:
                -- services/failover.py); the others are worded here from the result.
                waiting_detail = COALESCE(a.waiting_detail, CASE a.waiting_reason
                    WHEN 'Backoff' THEN 'retry after attempt ' || a.final_attempt_count || ': '
                                        || left(a.last_error, 200)
                    WHEN 'QuietHours' THEN 'the recipient''s quiet hours'
                    ELSE left(a.last_error, 200) END),
                updated_at = now()
            FROM accepted a
            -- One primary-key probe per retried result: a nested loop from `accepted`.
            WHERE n.id = a.id
              -- Still the claim that was read, compared with what `held` read rather than with
              -- a constant (`n.status = 'PROCESSING'` would be the lease index's predicate).
              AND n.claim_token = a.claim_token AND n.status = a.held_status
            RETURNING n.id, n.source, n.bucket, n.recipient
        )
        SELECT array_agg(id), array_agg(source),
               v_back_ids || array_agg(id), v_back_buckets || array_agg(bucket),
               v_back_recipients || array_agg(recipient)
        INTO v_retried, v_retried_sources, v_back_ids, v_back_buckets, v_back_recipients
        FROM retried;
        -- Kubernetes rows' status writes (PROCESSING and PENDING are not counted).
        IF 'kubernetes' = ANY(v_retried_sources) THEN
            v_noted := nq_note_changes(
                v_retried, v_retried_sources,
                array_fill('PROCESSING'::text, ARRAY[cardinality(v_retried)]),
                array_fill('PENDING'::text, ARRAY[cardinality(v_retried)]));
        END IF;
    END IF;

    -- The push tokens a provider answered 410 for, removed from their stored recipients.
    IF v_gone_tokens IS NOT NULL THEN
        PERFORM nq_forget_push_tokens(v_gone_recipient_ids, v_gone_tokens);
    END IF;

    -- Places in the window of attempts that sent nothing, finals and retries in one call, which
    -- locks the windows in the order every writer of windows uses.
    IF v_back_ids IS NOT NULL THEN
        PERFORM nq_give_back_places(v_back_buckets, v_back_recipients, v_back_ids);
    END IF;

    -- One row: the ids accepted (a digest's items are finished too, but are not results), and
    -- whether a webhook event may have been written (the worker wakes its relay only then).
    RETURN QUERY SELECT COALESCE(v_accepted, '{}') || COALESCE(v_retried, '{}'), v_events, v_noted;
END
$$;
