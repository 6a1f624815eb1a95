-- The completion as a function that carries the drain's plan settings, so the completion is one
-- round trip. Expand only: one new function; the previous release sends its own statement, which
-- reads and writes the same rows.
--
-- complete_deliveries ran in a transaction of its own for one reason: `SET LOCAL` of the
-- settings every drain statement is planned under (enable_seqscan off, generic plans: delivery.sql,
-- drain_begin), which needs a transaction block. That was three round trips for one statement,
-- ~130 us of a worker's CPU each, and the rows' locks held until the COMMIT came a round trip
-- later. A function takes the settings as attributes, for every statement it runs: the worker
-- calls it in autocommit, one round trip, and the locks go at the statement's end. PL/pgSQL keeps
-- the statement's plan per connection (generic from the first call, by the attribute), as the
-- prepared statement was kept.
--
-- What the statement does (it was delivery.sql's complete_deliveries, unchanged but for its
-- parameters):
-- Record a batch of results in one statement. A result is accepted only from the holder of the
-- current claim token of a PROCESSING row: each write names the token (no lock first, no read
-- first), so a late result from a worker whose lease expired matches nothing and is dropped; its
-- id is absent from the answer.
-- - A final result (SENT, FAILED, DEAD_LETTERED, SUPPRESSED, EXPIRED) moves the row to the log
--   with nq_finish_results (0039), given the results as they come: its DELETE works out each
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
CREATE FUNCTION nq_complete_deliveries(
    p_ids uuid[], p_claim_tokens uuid[], p_statuses text[], p_retry_in_seconds float8[],
    p_last_errors text[], p_provider_message_ids text[], p_providers text[], p_attempts jsonb,
    p_give_back bool[], p_next_attempt_ats timestamptz[], p_addresses_gone bool[],
    p_bound_providers text[], p_waiting_reasons text[], p_waiting_details text[],
    p_default_webhook_url text)
RETURNS TABLE (accepted uuid[], events_possible boolean, noted integer)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
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
        -- The retries' input (final results go to nq_finish_results as they came): a test of the
        -- parameter alone, so PostgreSQL skips the unnest, and every step of the retries' path
        -- reads nothing, when the batch has no retry (most batches).
        WHERE 'PENDING' = ANY(p_statuses)
    ), finished AS (
        SELECT f.* FROM nq_finish_results(
            p_ids, p_claim_tokens, p_statuses, p_last_errors,
            p_give_back, p_provider_message_ids, p_providers,
            p_bound_providers, p_attempts, p_default_webhook_url) AS f
    ), held AS MATERIALIZED (
        -- The retries' rows only (none in most batches), through the primary key, so the cost is
        -- per retry, never per PROCESSING row. Read without a lock (0030): while a row is
        -- PROCESSING under a token, only that token's holder changes it, so this is what the holder
        -- wrote last; `retried` names the token, and a row whose claim moved on in the meantime
        -- (its lease recovered, claimed again) is re-read by it and left alone. The status is
        -- checked in `accepted`, not here: `status = 'PROCESSING'` in this scan is the predicate of
        -- the lease index (nq_jobs_lease), and the plan this statement keeps per connection (made
        -- before any ANALYZE of a young queue, which it takes for a few rows) read every PROCESSING
        -- row through that index and filtered them by id: 500 rows for a batch of 100 with two
        -- workers, and a completion that grows with every claim in flight
        -- (tests/test_drain_plans.py). MATERIALIZED for the same reason: inlined into `accepted`,
        -- its join's status check would be a condition of this scan.
        SELECT n.id, n.status, n.claim_token, n.attempt_count, n.provider_message_id,
               n.delivery_attempts, n.next_attempt_at
        FROM nq_jobs n
        WHERE n.id = ANY(ARRAY(SELECT id FROM results WHERE status = 'PENDING'))
    ), accepted AS MATERIALIZED (
        -- MATERIALIZED: inlined into `retried` (its one reader), `h.status = 'PROCESSING'` here and
        -- `n.status = a.held_status` there would make the planner derive the lease index's predicate
        -- for the queue's scan.
        SELECT r.*, h.status AS held_status,
               h.attempt_count - CASE WHEN r.give_back THEN 1 ELSE 0 END AS final_attempt_count,
               COALESCE(r.provider_message_id, h.provider_message_id) AS final_provider_message_id,
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
            -- The worker words what only it knows (CircuitOpen, ProviderRateLimit: the providers it
            -- skipped and why, services/failover.py); the others are worded here from the result.
            waiting_detail = COALESCE(a.waiting_detail, CASE a.waiting_reason
                WHEN 'Backoff' THEN 'retry after attempt ' || a.final_attempt_count || ': '
                                    || left(a.last_error, 200)
                WHEN 'QuietHours' THEN 'the recipient''s quiet hours'
                ELSE left(a.last_error, 200) END),
            updated_at = now()
        FROM accepted a
        -- One primary-key probe per retried result: a nested loop from `accepted`, never the
        -- whole batch's ids scanned once per result (claim_admit_candidates, `admitted`).
        WHERE n.id = a.id
          -- Still the claim that was read (PROCESSING under the result's token), compared with what
          -- `held` read rather than with a constant: `n.status = 'PROCESSING'` would be the lease
          -- index's predicate, and a plan made on a young queue's statistics scans that index.
          AND n.claim_token = a.claim_token AND n.status = a.held_status
        RETURNING n.id, n.source, n.bucket, n.recipient
    ), noted AS (
        -- Kubernetes rows only (PROCESSING and PENDING are not counted), and only when there are
        -- some: a completion of API rows calls no function here.
        SELECT nq_note_changes(array_agg(id), array_agg(source), array_agg('PROCESSING'::text),
                               array_agg('PENDING'::text)) AS n
        FROM retried WHERE source = 'kubernetes'
        HAVING count(*) > 0
    ), gone_tokens AS (
        -- The push tokens a provider answered 410 for, removed from their stored recipients
        -- (nq_forget_push_tokens, 0040); called only when there are some (HAVING), so a batch
        -- without one sets up no write to nq_recipients.
        SELECT nq_forget_push_tokens(array_agg(recipient_id), array_agg(recipient)) AS n
        FROM finished
        WHERE status <> 'SENT' AND channel = 'push' AND recipient_id IS NOT NULL
          AND id = ANY(ARRAY(SELECT r.id FROM unnest(p_ids, p_addresses_gone)
                                 AS r(id, address_gone) WHERE r.address_gone))
        HAVING count(*) > 0
    ), given_back AS (
        -- Places in the window of attempts that sent nothing, finals and retries in one call, which
        -- locks the windows in the order every writer of windows uses (nq_give_back_places, 0040);
        -- called only when there are some, so a batch of SENT results touches no window.
        SELECT nq_give_back_places(array_agg(bucket), array_agg(recipient), array_agg(id)) AS n
        FROM (SELECT id, bucket, recipient FROM finished WHERE status <> 'SENT'
              UNION ALL SELECT id, bucket, recipient FROM retried) g
        HAVING count(*) > 0
    )
    -- noted, gone_tokens and given_back are read here (once each, as init plans) so that they run:
    -- a CTE no query reads is not run unless it writes itself. One row: the ids accepted (a digest's
    -- items are finished too, but are not results), and whether a finished row may have its webhook
    -- event (nq_finish_results writes one for a row with a URL of its own, its policy's, or the
    -- default): the worker wakes its relay only then.
    SELECT ARRAY(SELECT id FROM finished JOIN unnest(p_ids) AS r(id) USING (id)
                 UNION ALL SELECT id FROM retried) AS accepted,
           p_default_webhook_url IS NOT NULL
               OR EXISTS (SELECT 1 FROM finished WHERE webhook_url IS NOT NULL OR policy IS NOT NULL)
               AS events_possible,
           (SELECT n FROM noted) AS noted
    WHERE (SELECT count(*) FROM gone_tokens) >= 0 AND (SELECT count(*) FROM given_back) >= 0;
END
$$;
