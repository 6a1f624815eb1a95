-- The worker's hot path. Every statement here serves a whole batch in one round trip.

-- name: claim_lock_candidates
-- Step 1 of a claim in a transaction (functions/nq_claim_lock_v2.sql): up to %(limit)s due
-- notifications, the most urgent by aged priority, locked (SKIP LOCKED) with their recipients'
-- rate-limit locks, what quiet hours need to be decided for those whose stored recipient has
-- them, and whether any is user-targeted.
SELECT * FROM nq_claim_lock_v2(%(priorities)b::smallint[], %(channels)b::text[], %(limit)s,
                               %(aging_seconds)s::float8)

-- name: claim
-- nq_claim_v2 (functions/nq_claim_v2.sql says each step). Without candidates (`ids` NULL), the
-- claim in one round trip, in autocommit: the lock step, then the admission when no candidate is
-- user-targeted; a row with `screen` true means nothing was admitted, and the worker claims in a
-- transaction instead, where it decides quiet hours and the send-time check. No row: nothing was
-- due. With the candidates claim_lock_candidates locked in the worker's transaction (`ids`, and
-- `quiet_ids` among them, which the worker decided quiet hours hold), step 2 alone: admit those
-- within their recipient's window (PROCESSING, the claim token, a lease, one more attempt, the
-- provider bound), defer the others to when their window frees, hold those of a policy that is not
-- Ready, close or park digests, cancel acknowledged escalation steps; the admitted rows in claim
-- order, quiet ones without a place in the window, each with its address's suppression reason
-- (`suppressed`: NULL when not suppressed).
SELECT * FROM nq_claim_v2(
    %(priorities)b::smallint[], %(channels)b::text[], %(limit)s, %(aging_seconds)s::float8,
    %(claim_token)s, %(rate_limit)s, %(rate_window_seconds)s, %(lease_seconds)s, %(backoff_base_seconds)s,
    %(backoff_max_seconds)s, %(chain_channels)b::text[], %(chain_heads)b::text[],
    %(known_providers)b::text[], %(webhook_url)s, %(ids)b::uuid[], %(quiet_ids)b::uuid[])

-- name: claim_due_buckets
-- Citus only (docs/scaling.md "Citus: the claim"): FOR UPDATE SKIP LOCKED runs only in a query
-- that names one bucket (one shard), so a claim first looks, without locks, at the `limit` most
-- urgent due rows across every shard: each lane's `limit` oldest due rows (Citus pushes each
-- ORDER BY ... LIMIT down to every shard, one probe of each shard's claim index, and merges),
-- ranked by their lanes' aged priority (nq_claim_lock_v2's rule). Of those rows, `last_priority` is the least
-- urgent rank among them (P*: every due row more urgent than it is among them); per bucket,
-- `urgent` counts its rows more urgent than P*, `last_due` is its oldest P* row's due time (NULL:
-- none among them), `priority` and `due` its most urgent row's. The worker then claims bucket by
-- bucket (claim_lock_candidates_bucket, claim_admit_candidates_bucket in citus/statements.sql:
-- functions delegated to the bucket's node) in the order and with the sizes of
-- DeliveryRepository.notifications_claim: every urgent row, and the batch's remaining room filled
-- with P* rows from as few buckets as possible, the bucket of the oldest P* row first. The
-- filters are nq_claim_lock_v2's. On plain PostgreSQL the claim over the whole queue is kept
-- (no extra round trip per bucket).
SELECT bucket, max(top) AS last_priority,
       count(*) FILTER (WHERE rank < top) AS urgent,
       min(next_attempt_at) FILTER (WHERE rank = top) AS last_due,
       min(rank) AS priority, min(next_attempt_at) AS due
FROM (SELECT bucket, rank, next_attempt_at, max(rank) OVER () AS top
      FROM (SELECT h.bucket, {{_claim_lane_rank}} AS rank, h.next_attempt_at
            FROM (SELECT %(aging_seconds)s::float8 AS p_aging_seconds) a,
                 ((SELECT bucket, priority, next_attempt_at FROM nq_jobs
                   WHERE status = 'PENDING' AND priority = 0
                     AND 0 = ANY(%(priorities)b::smallint[])
                     AND next_attempt_at <= now() AND channel = ANY(%(channels)b::text[])
                     AND (expires_at IS NULL OR expires_at > now())
                   ORDER BY next_attempt_at LIMIT %(limit)s)
                  UNION ALL
                  (SELECT bucket, priority, next_attempt_at FROM nq_jobs
                   WHERE status = 'PENDING' AND priority = 1
                     AND 1 = ANY(%(priorities)b::smallint[])
                     AND next_attempt_at <= now() AND channel = ANY(%(channels)b::text[])
                     AND (expires_at IS NULL OR expires_at > now())
                   ORDER BY next_attempt_at LIMIT %(limit)s)
                  UNION ALL
                  (SELECT bucket, priority, next_attempt_at FROM nq_jobs
                   WHERE status = 'PENDING' AND priority = 2
                     AND 2 = ANY(%(priorities)b::smallint[])
                     AND next_attempt_at <= now() AND channel = ANY(%(channels)b::text[])
                     AND (expires_at IS NULL OR expires_at > now())
                   ORDER BY next_attempt_at LIMIT %(limit)s)) h
            ORDER BY rank, h.next_attempt_at LIMIT %(limit)s) d) d
GROUP BY bucket
ORDER BY bucket

-- name: complete_deliveries
-- Record a batch of results: nq_complete_deliveries (functions/), which says what it writes and
-- why. A
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
-- the claim counted and the place in the window it took (nq_release_claims).
SELECT released, noted FROM nq_release_claims(%(ids)b::uuid[], %(claim_tokens)b::uuid[])

-- name: recover_expired_leases
-- Leases that ran out put back, or dead-lettered after a lost final re-check
-- (nq_recover_expired_leases).
SELECT recovered, dead_lettered, noted
FROM nq_recover_expired_leases(%(limit)s::integer, %(default_webhook_url)s::text)

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
        (SELECT COALESCE(max({{_policy_longest_window}}), 0) FROM nq_policies p)))
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)

-- The claim's rules, written once: fragments of the admission statement that nq_claim_v2
-- (functions/nq_claim_v2.sql) and the Citus per-bucket nq_claim_admit_bucket (citus/functions.sql)
-- both expand. Where the two engines differ (which bucket, where the policies are read), the
-- statements around these fragments say so.

-- name: _claim_limits
-- A row's rate limit and window (its policy's, else the worker's), whether its policy holds it
-- (fail closed: a NotificationPolicy that exists but is not Ready holds its rows; no policy row:
-- the defaults), whether quiet hours hold it (decided by the worker), and its channel's limit.
COALESCE(p.rate_limit, p_rate_limit) AS rate_limit,
make_interval(secs => COALESCE(p.rate_window_seconds, p_rate_window_seconds)) AS win,
COALESCE(NOT p.ready, false) AS held,
n.id = ANY(p_quiet_ids) AS quiet,
-- The policy's limit for the row's channel, beside the recipient-wide one (NULL: none).
n.channel,
(p.channel_rate_limits -> n.channel ->> 'maxPerWindow')::integer AS channel_limit,
make_interval(secs => (p.channel_rate_limits -> n.channel ->> 'windowSeconds')::float8)
    AS channel_win,

-- name: _policy_longest_window
-- A policy's (`p`) longest window in seconds: its recipient-wide one or a channel's (NULL: none
-- of its own). Windows keep entries as long as the longest window in use counts them.
GREATEST(p.rate_window_seconds,
         (SELECT max((l.value ->> 'windowSeconds')::float8)
          FROM jsonb_each(p.channel_rate_limits) AS l))

-- name: _claim_lane_rank
-- A head row's (`h`) lane's aged priority: one higher (a lower rank) for each p_aging_seconds the
-- lane's oldest due row has waited since it became due, HIGH (0) at most, so a LOW lane ranks
-- with HIGH once its oldest row has waited twice that (docs/design.md, "Aging"); p_aging_seconds
-- 0: its priority. By lane, not by row: a lane's own rows go in fair-share turns, and a tenant's
-- old backlog never ranks above another tenant's new row of the same priority.
GREATEST(h.priority - COALESCE(floor(extract(epoch FROM now() - min(h.next_attempt_at)
                                                   OVER (PARTITION BY h.priority))
                                     / NULLIF(p_aging_seconds, 0)), 0), 0)

-- name: _claim_tenant_turn
-- A head row's (`h`) place among its tenant's rows of its lane, oldest due first.
row_number() OVER (PARTITION BY h.priority, h.tenant ORDER BY h.next_attempt_at, h.created_at)
    AS tenant_turn

-- name: _claim_fair_turn
-- A head row's turn in its lane: every tenant's first row, then every tenant's second, so a
-- tenant's backlog of any size delays another's due row by at most one claim (docs/quotas.md,
-- "Fair share"). One tenant: its rows oldest first, as before.
row_number() OVER (PARTITION BY h.priority ORDER BY h.tenant_turn, h.next_attempt_at, h.created_at)
    AS turn

-- name: _claim_fair_order
-- The claim's order over the queues' heads: the lanes' aged ranks, then turns (lanes of one rank
-- alternate), then priority.
h.rank, h.turn, h.priority

-- name: _claim_chain_head
-- The provider an unbound row is bound to: its policy's first provider this worker knows, else
-- the channel's chain head (read by position). A subquery only for a row with a policy.
COALESCE(
    CASE WHEN p.providers IS NOT NULL THEN
        (SELECT u.name FROM unnest(p.providers) WITH ORDINALITY AS u(name, position)
         WHERE u.name = ANY(p_known_providers) ORDER BY u.position LIMIT 1)
    END,
    p_chain_heads[array_position(p_chain_channels, n.channel)]) AS chain_head

-- name: _claim_window_used
-- The entries of a recipient's window still in it (`w`: the window read, `r.win` its length);
-- counted only where there is a window (most recipients have none).
CASE WHEN w.ids IS NULL THEN 0
     ELSE (SELECT count(*) FROM unnest(w.taken) AS t WHERE t > now() - r.win) END AS used

-- name: _claim_channel_used
-- The entries of the row's channel still in its channel window (`w`: the recipient's window, each
-- entry with its channel); counted only for a row whose policy limits its channel.
CASE WHEN b.channel_limit IS NULL OR cardinality(w.ids) = 0 THEN 0
     ELSE (SELECT count(*) FROM unnest(w.taken, w.channels) AS e(t, c)
           WHERE e.c = b.channel AND e.t > now() - b.channel_win) END AS channel_used

-- name: _claim_holds_slot
-- A row whose lease was recovered after a crash still holds the place its lost attempt took:
-- that place stands for the one delivery its key can make (the re-check goes out with the same
-- idempotency key), so it is admitted on it and does not compete for another. Looked for only
-- in a window with entries in it (AND stops at the first false).
w.used > 0 AND EXISTS (SELECT 1 FROM unnest(w.ids, w.taken) AS e(id, t)
                       WHERE e.id = b.id AND e.t > now() - b.win) AS holds_slot

-- name: _claim_channel_rank
-- A row's place in its recipient's queue for its channel's window (the `decided` rows, `d`);
-- held, quiet, acknowledged rows and rows holding their place rank apart.
row_number() OVER (PARTITION BY d.bucket, d.recipient, d.channel, d.channel_win, d.holds_slot,
                                d.held, d.quiet, d.acknowledged
                   ORDER BY d.priority, d.next_attempt_at, d.created_at) AS channel_rank

-- name: _claim_rank
-- Whether the row's channel window is full, and the row's place in its recipient's queue for the
-- recipient-wide window; held, quiet, acknowledged rows, rows holding their place and rows whose
-- channel window is full rank apart, so they never take a place from a sendable row.
d.channel_limit IS NOT NULL AND d.channel_rank > d.channel_limit - d.channel_used
    AS channel_full,
row_number() OVER (PARTITION BY d.bucket, d.recipient, d.holds_slot, d.held, d.quiet,
                                d.acknowledged,
                                d.channel_limit IS NOT NULL
                                AND d.channel_rank > d.channel_limit - d.channel_used
                   ORDER BY d.priority, d.next_attempt_at, d.created_at) AS rank

-- name: _claim_admits
-- Whether a ranked row (`r`) is admitted: quiet (the send-time check defers it), holding its
-- place, or within both its channel's window and its recipient's.
NOT r.held AND NOT r.acknowledged
AND (r.quiet OR r.holds_slot OR (NOT r.channel_full AND r.rank <= r.rate_limit - r.used))

-- name: _claim_admitted
-- What an admitted row becomes: PROCESSING under the claim's token with a lease and one more
-- attempt (counted when claimed, so a row that crashes every worker still runs out), bound to
-- its provider (a bound row keeps its binding: an earlier attempt there has an unknown outcome).
SET status = 'PROCESSING',
    attempt_count = n.attempt_count + 1,
    claim_token = p_claim_token,
    lease_expires_at = now() + make_interval(secs => p_lease_seconds),
    provider = COALESCE(n.provider, r.chain_head),
    waiting_reason = NULL, waiting_until = NULL, waiting_detail = NULL,
    updated_at = now()

-- name: _claim_waiting
-- The body of the `waiting` CTE: a row its channel's window has no place for waits for the
-- (used - limit + rank)-th oldest entry of its channel to leave that window; else a row the
-- recipient's window has no place for, for that entry of the recipient's window. When that one is
-- not taken yet (a burst within one batch), a full window from now.
SELECT r.id,
       CASE WHEN r.channel_full THEN
           COALESCE((SELECT e.t FROM unnest(r.taken, r.channels) AS e(t, c)
                     WHERE e.c = r.channel AND e.t > now() - r.channel_win
                     ORDER BY e.t
                     OFFSET GREATEST(r.channel_used - r.channel_limit + r.channel_rank - 1, 0)
                     LIMIT 1),
                    now()) + r.channel_win
       ELSE
           COALESCE((SELECT t FROM unnest(r.taken) AS t
                     WHERE t > now() - r.win
                     ORDER BY t
                     OFFSET GREATEST(r.used - r.rate_limit + r.rank - 1, 0) LIMIT 1),
                    now()) + r.win
       END AS frees_at,
       CASE WHEN r.channel_full THEN r.channel_limit ELSE r.rate_limit END AS rate_limit,
       CASE WHEN r.channel_full THEN r.channel_win ELSE r.win END AS win,
       CASE WHEN r.channel_full THEN ' ' || r.channel END AS limited_channel
FROM ranked r
WHERE NOT r.held AND NOT r.quiet AND NOT r.holds_slot AND NOT r.acknowledged
  AND (r.channel_full OR r.rank > r.rate_limit - r.used)

-- name: _claim_rate_limited
-- A row waiting for a place in its recipient's window (or its channel's): due when the place
-- frees, no attempt used. (`::text`: `text || integer` is a STABLE operator, which Citus refuses on a column in an
-- UPDATE; the cast is immutable and the text the same.)
SET next_attempt_at = w.frees_at, updated_at = now(),
    waiting_reason = 'RecipientRateLimit', waiting_until = w.frees_at,
    waiting_detail = 'recipient reached ' || w.rate_limit::text
                     || COALESCE(w.limited_channel, '') || ' per '
                     || extract(epoch FROM w.win)::bigint::text || ' s'

-- name: _claim_policy_not_ready
-- A row its policy holds (not Ready): looked at again in 30 s, no attempt used, nothing returned.
-- Out of the claim index's head, claims stay cheap; the operator shows it as PolicyNotReady.
SET next_attempt_at = now() + interval '30 seconds',
    waiting_reason = 'PolicyNotReady', waiting_until = now() + interval '30 seconds',
    waiting_detail = 'policy ' || n.policy || ' is not Ready; looked at again every 30 s',
    updated_at = now()

-- name: _claim_released
-- A claimed, untried row handed back: PENDING and due now (it waits for nothing but a worker),
-- the attempt the claim counted given back. The reason it waited is cleared again so no path back
-- to PENDING carries a stale one.
SET status = 'PENDING', attempt_count = n.attempt_count - 1, next_attempt_at = now(),
    claim_token = NULL, lease_expires_at = NULL, updated_at = now(),
    waiting_reason = NULL, waiting_until = NULL, waiting_detail = NULL

-- name: _lease_lost_error
-- The error a row whose lease ran out records. (`::text`: Citus refuses the STABLE
-- `text || integer` on a column in an UPDATE; the cast is immutable, the text the same.)
'lease expired during attempt ' || attempt_count::text || ' (worker lost)'

-- name: _lease_recovered
-- A row whose lease ran out, put back: PENDING, due now, the attempt still counted (the
-- assignments after its `last_error`, which is _lease_lost_error).
status = 'PENDING',
    next_attempt_at = now(),
    claim_token = NULL,
    lease_expires_at = NULL,
    waiting_reason = NULL, waiting_until = NULL, waiting_detail = NULL,
    updated_at = now()

-- name: _window_give_back
-- A window without the entries of `g.ids` (places given back: nothing was sent).
SET (ids, taken, channels) = (
    SELECT COALESCE(array_agg(o.id ORDER BY o.t, o.id), '{}'),
           COALESCE(array_agg(o.t ORDER BY o.t, o.id), '{}'),
           COALESCE(array_agg(o.c ORDER BY o.t, o.id), '{}')
    FROM unnest(w.ids, w.taken, w.channels) AS o(id, t, c) WHERE o.id <> ALL(g.ids))

-- name: _claim_digest_parked
-- [digests] An item that is not its digest's carrier: parked a day (the carrier's result ends it
-- before), or a second when its digest is busy. now() outside CASE, and CASE in its searched
-- form: Citus refuses a non-immutable function inside CASE in a distributed UPDATE, and
-- misplans `CASE x WHEN`.
SET next_attempt_at = now() + CASE WHEN r.role = 'busy' THEN interval '1 second'
                                   ELSE interval '1 day' END,
    waiting_reason = 'DigestWindow',
    waiting_until = now() + CASE WHEN r.role = 'busy' THEN interval '1 second' END,
    waiting_detail = CASE WHEN r.role = 'busy' THEN 'its digest is being joined or left'
                          ELSE 'sent with its digest' END,
    updated_at = now()

-- name: _claimed_columns
-- A claimed notification as the claim functions answer it (nq_claim, nq_claim_v2 and the Citus
-- admission), after their own leading columns: what the worker sends it with.
id uuid, channel text, recipient text, subject text, body text, metadata jsonb,
attempt_count integer, max_attempts integer, priority smallint,
backoff_base_seconds float8, backoff_max_seconds float8, failover text, providers text[],
category text, expires_at timestamptz, recipient_id text, recipient_exists boolean,
timezone text, opt_out_all boolean, opt_out_channels text[], opt_out_categories text[],
quiet_start time, quiet_end time, bound_provider text, sticky_provider text,
next_attempt_at timestamptz, created_at timestamptz, send_at timestamptz,
traceparent text, digest_id uuid, digest_bucket smallint

-- name: _drain_function
-- The attributes of a drain function (its language and the plan settings every statement of the
-- drain runs under: the indexes whatever the statistics, one generic plan per connection), then
-- the start of its body.
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$

-- name: _moved_columns
-- A notification's columns, shared by the queue and the log, in the order the moves between
-- them (finish, retry) write them.
id, idempotency_key, request_hash, channel, recipient, subject, body, priority,
status, send_at, next_attempt_at, expires_at, attempt_count, max_attempts,
last_error, sent_at, provider_message_id, claim_token, lease_expires_at, retries,
source, policy, webhook_url, metadata, created_at, updated_at, finished_at,
recipient_id, category, template_name, template_version, provider,
delivery_attempts, bucket, digest_id, escalation_id, traceparent, tenant

-- name: _final_values
-- A finishing row's final values (`j`: its queue row, `g`: what the caller gave, a NULL array of
-- the caller's keeping the row's own), as nq_finish_held and its Citus form move it.
j.status AS old_status,
COALESCE(g.status, j.status) AS final_status,
CASE WHEN p_last_errors IS NULL THEN j.last_error ELSE g.last_error END AS final_last_error,
COALESCE(g.attempt_count, j.attempt_count) AS final_attempt_count,
CASE WHEN p_provider_message_ids IS NULL THEN j.provider_message_id
     ELSE g.provider_message_id END AS final_provider_message_id,
CASE WHEN p_providers IS NULL THEN j.provider ELSE g.provider END AS final_provider,
COALESCE(g.delivery_attempts, j.delivery_attempts) AS final_delivery_attempts

-- name: _finished_rows
-- What the moves to the log return per row (nq_finish_held, nq_finish_results), for the caller's
-- answer and its webhook events.
TABLE (id uuid, status text, attempt_count integer, source text, channel text, recipient text,
       recipient_id text, bucket smallint, webhook_url text, policy text, provider text)

-- name: _log_moved
-- The log rows of the rows a move deleted from the queue (`moved`, with their final values),
-- returning what the caller answers and writes webhook events from (_finished_rows).
INSERT INTO nq_delivery_log ({{_moved_columns}})
{{_logged_values}}
FROM moved m
RETURNING id, status, attempt_count, source, channel, recipient, recipient_id, bucket,
          webhook_url, policy, provider

-- name: _logged_values
-- The log row of a moved notification (`m`: the queue's row with its final values): SENT gets
-- its sent_at, the claim and lease are cleared, finished_at is kept or now.
SELECT m.id, m.idempotency_key, m.request_hash, m.channel, m.recipient, m.subject, m.body,
       m.priority, m.final_status, m.send_at, m.next_attempt_at, m.expires_at,
       m.final_attempt_count, m.max_attempts, m.final_last_error,
       CASE WHEN m.final_status = 'SENT' THEN COALESCE(m.sent_at, now()) ELSE m.sent_at END,
       m.final_provider_message_id, NULL, NULL, m.retries, m.source, m.policy,
       m.webhook_url, m.metadata, m.created_at, now(), COALESCE(m.finished_at, now()),
       m.recipient_id, m.category, m.template_name, m.template_version, m.final_provider,
       m.final_delivery_attempts, m.bucket, m.digest_id, m.escalation_id, m.traceparent,
       m.tenant

-- name: _claim_digest_roles
-- [digests] The body of the claim's digest_roles CTE, and the batch CTE after it
-- (docs/digests.md).
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
