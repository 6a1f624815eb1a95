-- The worker's hot path. Every statement here serves a whole batch in one round trip.

-- name: claim_lock_candidates
-- Step 1 of a claim in a transaction (nq_claim_lock, 0042): up to %(limit)s due notifications
-- locked (SKIP LOCKED) with their recipients' rate-limit locks, what quiet hours need to be
-- decided for those whose stored recipient has them, and whether any is user-targeted.
SELECT * FROM nq_claim_lock(%(priorities)b::smallint[], %(channels)b::text[], %(limit)s)

-- name: claim
-- nq_claim (0042; what each step does is written there). Without candidates (`ids` NULL), the
-- claim in one round trip, in autocommit: the lock step, then the admission when no candidate is
-- user-targeted; a row with `screen` true means nothing was admitted, and the worker claims in a
-- transaction instead, where it decides quiet hours and the send-time check. No row: nothing was
-- due. With the candidates claim_lock_candidates locked in the worker's transaction (`ids`, and
-- `quiet_ids` among them, which the worker decided quiet hours hold), step 2 alone: admit those
-- within their recipient's window (PROCESSING, the claim token, a lease, one more attempt, the
-- provider bound), defer the others to when their window frees, hold those of a policy that is not
-- Ready, close or park digests, cancel acknowledged escalation steps; the admitted rows in claim
-- order, quiet ones without a place in the window.
SELECT * FROM nq_claim(
    %(priorities)b::smallint[], %(channels)b::text[], %(limit)s, %(claim_token)s, %(rate_limit)s,
    %(rate_window_seconds)s, %(lease_seconds)s, %(backoff_base_seconds)s,
    %(backoff_max_seconds)s, %(chain_channels)b::text[], %(chain_heads)b::text[],
    %(known_providers)b::text[], %(webhook_url)s, %(ids)b::uuid[], %(quiet_ids)b::uuid[])

-- name: claim_due_buckets
-- Citus only (docs/scaling.md "Citus: the claim"): FOR UPDATE SKIP LOCKED runs only in a query
-- that names one bucket (one shard), so a claim first looks, without locks, at the `limit` most
-- urgent due rows across every shard (Citus pushes the ORDER BY ... LIMIT down to each shard, one
-- probe of each shard's claim index, and merges). Of those rows, `last_priority` is the least
-- urgent priority among them (P*: every due row more urgent than it is among them); per bucket,
-- `urgent` counts its rows more urgent than P*, `last_due` is its oldest P* row's due time (NULL:
-- none among them), `priority` and `due` its most urgent row's. The worker then claims bucket by
-- bucket (claim_lock_candidates_bucket, claim_admit_candidates_bucket in citus/statements.sql:
-- functions delegated to the bucket's node) in the order and with the sizes of
-- DeliveryRepository.notifications_claim: every urgent row, and the batch's remaining room filled
-- with P* rows from as few buckets as possible, the bucket of the oldest P* row first. The
-- filters are nq_claim_lock's (0042). On plain PostgreSQL the claim over the whole queue is kept
-- (no extra round trip per bucket).
SELECT bucket, max(top) AS last_priority,
       count(*) FILTER (WHERE priority < top) AS urgent,
       min(next_attempt_at) FILTER (WHERE priority = top) AS last_due,
       min(priority) AS priority, min(next_attempt_at) AS due
FROM (SELECT bucket, priority, next_attempt_at, max(priority) OVER () AS top
      FROM (SELECT bucket, priority, next_attempt_at FROM nq_jobs
            WHERE status = 'PENDING' AND priority = ANY(%(priorities)b::smallint[])
              AND next_attempt_at <= now() AND channel = ANY(%(channels)b::text[])
              AND (expires_at IS NULL OR expires_at > now())
            ORDER BY priority, next_attempt_at LIMIT %(limit)s) d) d
GROUP BY bucket
ORDER BY bucket

-- name: complete_deliveries
-- Record a batch of results: nq_complete_deliveries (0041), which says what it writes and why. A
-- function so that it carries the drain's plan settings itself: the worker calls it in
-- autocommit, one round trip, where the statement needed a transaction of its own for SET LOCAL
-- (BEGIN and the settings, the statement, COMMIT). One row: the ids accepted, and whether a
-- finished row may have its webhook event.
SELECT c.accepted, c.events_possible
FROM nq_complete_deliveries(
    %(ids)b::uuid[], %(claim_tokens)b::uuid[], %(statuses)b::text[],
    %(retry_in_seconds)b::float8[], %(last_errors)b::text[], %(provider_message_ids)b::text[],
    %(providers)b::text[], %(attempts)s::jsonb, %(give_back)b::bool[],
    %(next_attempt_ats)b::timestamptz[], %(addresses_gone)b::bool[],
    %(bound_providers)b::text[], %(waiting_reasons)b::text[], %(waiting_details)b::text[],
    %(default_webhook_url)s::text) AS c

-- name: release_claims
-- Graceful shutdown: hand claimed-but-unsent notifications back at once, giving back the attempt
-- the claim counted and the place in the window it took (the notification was never tried).
WITH released AS (
    UPDATE nq_jobs n
    {{_released}}
    WHERE {{_released_match}}
    RETURNING n.id, n.source, n.bucket, n.recipient
), noted AS (
    SELECT nq_note_changes(array_agg(id), array_agg(source), array_agg('PROCESSING'::text),
                           array_agg('PENDING'::text)) AS n
    FROM released WHERE source = 'kubernetes'
), given_back AS (
    SELECT nq_give_back_places(array_agg(bucket), array_agg(recipient), array_agg(id)) AS n
    FROM released
    HAVING count(*) > 0
)
SELECT count(*) AS released, (SELECT n FROM noted) AS noted FROM released
WHERE (SELECT count(*) FROM given_back) >= 0

-- name: _released
-- A released row, on both engines (release_claims_bucket on Citus): PENDING and due now, its
-- attempt given back. It waits for nothing but a worker: the claim cleared the reason already,
-- said again in this write so no path back to PENDING can carry a stale one.
SET status = 'PENDING', attempt_count = n.attempt_count - 1, next_attempt_at = now(),
    claim_token = NULL, lease_expires_at = NULL, updated_at = now(),
    waiting_reason = NULL, waiting_until = NULL, waiting_detail = NULL
FROM unnest(%(ids)b::uuid[], %(claim_tokens)b::uuid[]) AS r(id, claim_token)

-- name: _released_match
-- Only a row still held by the claim that is handing it back.
n.id = ANY(%(ids)b::uuid[]) AND n.id = r.id AND n.claim_token = r.claim_token
AND n.status = 'PROCESSING'

-- name: recover_expired_leases
-- A lease that ran out means its worker died (or hangs): put the notification back to be tried
-- again with the same idempotency key. The attempt stays counted. A crash on the last attempt
-- gets one final re-check (attempt max+1, same key: a provider that already delivered it says so);
-- a crash during that re-check dead-letters it (nq_finish_held), so a poison notification never
-- loops.
-- SKIP LOCKED: several workers may run this at once; each row is recovered once.
WITH expired AS (
    SELECT id, attempt_count, max_attempts, source FROM nq_jobs
    WHERE status = 'PROCESSING' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), dead AS (
    SELECT f.* FROM nq_finish_held(
        ARRAY(SELECT id FROM expired WHERE attempt_count > max_attempts), NULL,
        ARRAY(SELECT 'DEAD_LETTERED' FROM expired WHERE attempt_count > max_attempts),
        ARRAY(SELECT 'lease expired during attempt ' || attempt_count || ' (worker lost)'
              FROM expired WHERE attempt_count > max_attempts),
        NULL, NULL, NULL, NULL, %(default_webhook_url)s) AS f
), recovered AS (
    UPDATE nq_jobs n
    SET status = 'PENDING',
        last_error = 'lease expired during attempt ' || n.attempt_count || ' (worker lost)',
        next_attempt_at = now(),
        claim_token = NULL,
        lease_expires_at = NULL,
        -- Due now (see release_claims).
        waiting_reason = NULL, waiting_until = NULL, waiting_detail = NULL,
        updated_at = now()
    WHERE n.id = ANY(ARRAY(SELECT id FROM expired WHERE attempt_count <= max_attempts))
    RETURNING n.id, n.source
), noted AS (
    SELECT nq_note_changes(array_agg(id), array_agg(source), array_agg('PROCESSING'::text),
                           array_agg('PENDING'::text)) AS n
    FROM recovered WHERE source = 'kubernetes'
)
SELECT (SELECT count(*) FROM recovered) + (SELECT count(*) FROM dead) AS recovered,
       (SELECT count(*) FROM dead) AS dead_lettered, (SELECT n FROM noted) AS noted

-- name: expire_overdue
-- PENDING notifications whose expiresAt passed become EXPIRED (nq_finish_held: the move to the log,
-- the counters, the status write, the webhook event).
WITH overdue AS (
    SELECT id, last_error FROM nq_jobs
    WHERE status = 'PENDING' AND expires_at IS NOT NULL AND expires_at <= now()
    ORDER BY expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
SELECT count(*) AS expired
FROM nq_finish_held(
    ARRAY(SELECT id FROM overdue), NULL,
    ARRAY(SELECT 'EXPIRED' FROM overdue),
    ARRAY(SELECT COALESCE(last_error, 'expired before it could be sent') FROM overdue),
    NULL, NULL, NULL, NULL, %(default_webhook_url)s)

-- name: housekeeping_next_due_at
-- When the next lease runs out and the next PENDING notification expires, and the database's now
-- (so the worker's clock never matters): an idle worker sleeps until its housekeeping has
-- something to do instead of sweeping every second. Each is the first entry of its partial index
-- (nq_jobs_lease, nq_jobs_expiry): two index probes, no scan, whatever the backlog.
SELECT (SELECT min(lease_expires_at) FROM nq_jobs WHERE status = 'PROCESSING') AS lease_ends_at,
       (SELECT min(expires_at) FROM nq_jobs
        WHERE status = 'PENDING' AND expires_at IS NOT NULL) AS expires_at,
       now() AS now

-- name: next_due_at
-- When this worker's lanes next have work it can claim: the first row of each priority's range of
-- the claim index that passes the claim's own filter (its channels, not expired), so a worker can
-- sleep exactly until a scheduled notification is due instead of a poll. The filters must stay
-- those of claim_lock_candidates: a row this query counts but the claim skips (an sms for an
-- email-only worker, an expired row housekeeping has not reached yet) would say "due now" forever
-- and the worker would spin. Rows of other channels ahead of the first match are read and skipped
-- once per wake-up, not once per loop.
-- One subquery per priority (HIGH 0, NORMAL 1, LOW 2; one the worker does not serve reads
-- nothing: its `= ANY` is a one-time filter), each the first claim-index entry of that priority,
-- then the least. Both engines run it: Citus pushes each ORDER BY ... LIMIT 1 down to every
-- shard, where a LATERAL over the lanes cannot be pushed down.
SELECT LEAST(
       (SELECT next_attempt_at FROM nq_jobs
        WHERE status = 'PENDING' AND priority = 0 AND 0 = ANY(%(priorities)b::smallint[])
          AND channel = ANY(%(channels)b::text[]) AND (expires_at IS NULL OR expires_at > now())
        ORDER BY next_attempt_at LIMIT 1),
       (SELECT next_attempt_at FROM nq_jobs
        WHERE status = 'PENDING' AND priority = 1 AND 1 = ANY(%(priorities)b::smallint[])
          AND channel = ANY(%(channels)b::text[]) AND (expires_at IS NULL OR expires_at > now())
        ORDER BY next_attempt_at LIMIT 1),
       (SELECT next_attempt_at FROM nq_jobs
        WHERE status = 'PENDING' AND priority = 2 AND 2 = ANY(%(priorities)b::smallint[])
          AND channel = ANY(%(channels)b::text[]) AND (expires_at IS NULL OR expires_at > now())
        ORDER BY next_attempt_at LIMIT 1)) AS next_due_at,
       now() AS now

-- name: prune_rate_windows
-- A recipient's window whose newest entry is older than the longest window in use (the
-- default's or any policy's) counts for nothing: delete it, in bounded chunks (the BRIN on
-- last_taken_at finds them). SKIP LOCKED: a window a claim is writing is recent anyway, and this
-- never waits on (or deadlocks with) a claim.
DELETE FROM nq_rate_windows
WHERE (bucket, recipient) IN (
    SELECT bucket, recipient FROM nq_rate_windows
    WHERE last_taken_at < now() - make_interval(secs => GREATEST(
        %(default_window_seconds)s,
        (SELECT COALESCE(max(rate_window_seconds), 0) FROM nq_policies)))
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)

-- name: _claim_digest_roles
-- [digests] The body of the Citus claim's digest_roles CTE, and the batch CTE after it
-- (docs/digests.md; nq_claim, 0042, holds the plain claim's, the same text).
    -- [digests] The carrier goes on as any row (rate limit, quiet hours, policy, providers: the
    -- digest is one message); another item of its digest is parked, one whose digest is busy
    -- waits a second.
    SELECT b.id, b.bucket, b.digest_id,
           CASE WHEN l.id IS NULL THEN 'busy'
                WHEN l.carrier_id = b.id THEN 'carrier'
                WHEN l.orphaned AND b.id = (SELECT o.id FROM batch_all o
                                            WHERE o.digest_id = b.digest_id
                                            ORDER BY o.created_at, o.id LIMIT 1) THEN 'carrier'
                ELSE 'parked' END AS role
    FROM batch_all b LEFT JOIN digest_locked l ON l.bucket = b.bucket AND l.id = b.digest_id
    WHERE b.digest_id IS NOT NULL
), batch AS (
    SELECT b.* FROM batch_all b
    WHERE b.digest_id IS NULL
       OR b.id = ANY(ARRAY(SELECT id FROM digest_roles WHERE role = 'carrier'))
