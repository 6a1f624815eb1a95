-- The webhook outbox: dispatch of events written by the status-changing statements.

-- name: _webhook_due
-- The events due now, oldest due first, up to %(limit)s, locked (SKIP LOCKED: relays split the
-- work): webhook_claim_due and its Citus form, which names the bucket first.
state = 'pending' AND next_attempt_at <= now()
ORDER BY next_attempt_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: webhook_claim_due
-- Take up to %(limit)s due events. SKIP LOCKED splits them between dispatchers; the claim is a
-- lease: next_attempt_at moves %(lease_seconds)s ahead, so an event whose dispatcher died is
-- picked up again later, with the same id (at least once).
-- The attempt counts here, in the claim's own write, not when its result is recorded: a POST
-- whose result never gets recorded (the process died, the task failed, the answer could not be
-- read) still used its attempt. An event due again with %(max_attempts)s attempts used was
-- claimed at its last one and its result never came: it ends `failed` here, in the same
-- statement, instead of being POSTed again. So `attempts` <= %(max_attempts)s bounds the POSTs
-- of an event whatever its receiver answers and whatever crashes.
-- Mixed versions (0.1.0 relays beside these during an upgrade): 0.1.0's claim is this statement
-- without the bound, so it too adds 1 here, and its webhook_record_results is the one below,
-- which never touches `attempts`; each process records only what it claimed (the claim_token).
-- Every claim, by either version, counts once and recording counts nothing: no double count.
-- Until the last 0.1.0 relay stops, it may still claim an event whose last attempt's result was
-- lost and POST it once more (it then records it failed): the bound holds once it is gone.
-- Secrets are read now from the policy, so a rotated secret applies to the next attempt;
-- they sign only an event for the policy's own webhook URL (docs/security.md).
-- The UPDATEs find their rows through the primary key (`= ANY`), never by a join the planner
-- could turn into a scan of the whole outbox, so a claim costs the same however many delivered
-- events the table holds.
WITH due AS (
    SELECT id, attempts FROM nq_webhook_events
    WHERE {{_webhook_due}}
),
spent AS (
    UPDATE nq_webhook_events e
    {{_webhook_spent_set}}
    WHERE e.id = ANY(ARRAY(SELECT id FROM due WHERE attempts >= %(max_attempts)s))
    RETURNING e.state
), claimed AS (
    UPDATE nq_webhook_events e
    {{_webhook_claim_set}}
    WHERE e.id = ANY(ARRAY(SELECT id FROM due WHERE attempts < %(max_attempts)s))
    {{_webhook_claimed_returning}}
), {{_webhook_claim_answer}}

-- name: _webhook_spent_set
-- The claim's rules, written once for both engines (webhook_claim_due_bucket, Citus, runs them
-- in one bucket). An event due again with its attempts used: failed, with why.
SET state = 'failed',
    claim_token = NULL,
    last_error = 'attempt ' || e.attempts || ': no result recorded before its lease expired'
                 || COALESCE(' (before: ' || left(e.last_error, 200) || ')', '')

-- name: _webhook_claim_set
-- The attempt counted and the lease taken. The claim token comes from the dispatcher, one per
-- batch: Citus refuses volatile functions in a distributed UPDATE, and the token is matched with
-- the event's id.
SET attempts = e.attempts + 1,
    claim_token = %(claim_token)s,
    next_attempt_at = now() + make_interval(secs => %(lease_seconds)s)

-- name: _webhook_claimed_returning
-- A policy's secrets sign only for its own URL: not for a client's webhookUrl.
RETURNING e.id, e.notification_id, e.url, e.payload, e.attempts, e.claim_token, e.policy,
          (SELECT p.webhook_secrets FROM nq_policies p
           WHERE p.name = e.policy AND p.webhook_url = e.url) AS policy_secrets

-- name: _webhook_claim_answer
-- The failed events counted, and one row of NULLs when nothing was claimed. `counted` is read in
-- the select list (an init plan) so that it runs: a column of a subquery that the outer query
-- does not select is dropped by the planner, and a CTE read only there would never run. IS NULL:
-- Citus keeps a CTE's result for the next step, and cannot keep a void column.
counted AS (
    SELECT nq_count('webhooks', NULL, array_agg(state), '{pending}') IS NULL AS done FROM spent
)
SELECT c.*, (SELECT done FROM counted) IS NULL AS counted
FROM (SELECT 1) f LEFT JOIN claimed c ON true

-- name: webhook_record_results
-- Record a batch of dispatch results in one statement; only the current claim's result counts.
-- A delivered or failed event is counted (0004's counters) by this statement. The times are
-- computed first in `r`: Citus refuses now() inside COALESCE or CASE in a multi-shard SET, and
-- both engines run this one statement.
WITH r AS (
    SELECT r.id, r.claim_token, r.state, r.last_error,
           now() + make_interval(secs => r.retry_in_seconds) AS next_attempt_at,
           CASE WHEN r.state = 'delivered' THEN now() END AS delivered_at
    FROM unnest(%(ids)b::uuid[], %(claim_tokens)b::uuid[], %(states)b::text[],
                %(retry_in_seconds)b::float8[], %(last_errors)b::text[])
         AS r(id, claim_token, state, retry_in_seconds, last_error)
), recorded AS (
    UPDATE nq_webhook_events e
    SET state = r.state,
        next_attempt_at = COALESCE(r.next_attempt_at, e.next_attempt_at),
        last_error = r.last_error,
        delivered_at = r.delivered_at,
        claim_token = NULL
    FROM r
    -- Through the primary key (`= ANY`), so the cost is per result, never per event in the table.
    WHERE e.id = ANY(%(ids)b::uuid[]) AND e.id = r.id AND e.claim_token = r.claim_token
    RETURNING e.id, e.state
), counted AS (
    -- IS NULL: Citus keeps a CTE's result for the next step, and cannot keep a void column.
    SELECT nq_count('webhooks', NULL, array_agg(state), '{pending}') IS NULL AS done FROM recorded
)
-- `counted` is read in the select list so that it runs (see webhook_claim_due).
SELECT r.id, (SELECT done FROM counted) IS NULL AS counted FROM recorded r

-- name: webhook_next_due_at
SELECT min(next_attempt_at) AS next_due_at, now() AS now
FROM nq_webhook_events WHERE state = 'pending'

-- name: webhook_events_for_notification
SELECT id, notification_id, url, payload, state, attempts, last_error, created_at, delivered_at
FROM nq_webhook_events WHERE notification_id = %(notification_id)s ORDER BY created_at

-- name: webhook_traceparents
-- The trace context of each claimed event's notification, read only while tracing is on (one
-- statement per claim, none when off): the relay's POST continues the notification's trace.
-- A notification with an event is final, so in the log (unless a retry moved it back to the
-- queue); the view reads both, each through its index on id.
SELECT id, traceparent FROM nq_all_notifications
WHERE id = ANY(%(ids)b::uuid[]) AND traceparent IS NOT NULL
