-- The worker's hot path. Every statement here serves a whole batch in one round trip.

-- name: claim_lock_candidates
-- Step 1 of a claim (one transaction, two statements): lock up to %(limit)s due notifications
-- and the rate-limit locks of their recipients.
--
-- Rows: for each priority this worker serves, highest first, read the top of that priority's
-- range of the partial claim index (status = 'PENDING', ordered by next_attempt_at, created_at)
-- with FOR UPDATE SKIP LOCKED: rows another worker has locked are skipped, never waited for, so
-- concurrent workers each get different rows. The executor pulls lazily through the LATERAL and
-- the outer LIMIT, so a lower priority is read (and locked) only when the higher ones ran out.
-- Expired rows are left to expire_overdue.
--
-- Recipients: a transaction-scoped advisory lock per distinct recipient, taken in the order of
-- its key, so two workers with overlapping recipients queue up instead of deadlocking. While
-- held, no other worker can count or take that recipient's rate-limit slots: two workers cannot
-- both take the last slot. Other recipients are not affected. The count itself must run in the
-- next statement, whose snapshot sees slots committed by a worker we waited for here.
--
-- Quiet hours: of the candidates whose stored recipient has quiet hours, what the worker needs to
-- tell whether quiet hours hold them now (services/preferences.py decides, on the worker's
-- clock), so step 2 can keep those out of the recipient's window. A primary-key lookup each,
-- aggregated in one pass so the arrays line up.
WITH candidates AS (
    SELECT n.id, n.recipient, n.recipient_id, n.priority, n.category
    FROM unnest(%(priorities)b::smallint[]) AS lane(priority)
    CROSS JOIN LATERAL (
        SELECT id, recipient, recipient_id, priority, category
        FROM nq_queue
        WHERE status = 'PENDING'
          AND priority = lane.priority
          AND next_attempt_at <= now()
          AND channel = ANY(%(channels)b::text[])
          AND (expires_at IS NULL OR expires_at > now())
        ORDER BY next_attempt_at, created_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) n
    LIMIT %(limit)s
), recipient_locks AS (
    SELECT pg_advisory_xact_lock(key)
    FROM (SELECT DISTINCT hashtextextended(recipient, 0) AS key FROM candidates ORDER BY key) k
), quiet AS (
    SELECT array_agg(c.id) AS ids, array_agg(c.priority) AS priorities,
           array_agg(c.category) AS categories, array_agg(r.timezone) AS timezones,
           array_agg(r.quiet_start) AS starts, array_agg(r.quiet_end) AS ends
    FROM candidates c JOIN nq_recipients r ON r.id = c.recipient_id
    WHERE r.quiet_start IS NOT NULL AND r.quiet_end IS NOT NULL
)
SELECT ARRAY(SELECT c.id FROM candidates c) AS ids, q.ids AS quiet_ids,
       q.priorities AS quiet_priorities, q.categories AS quiet_categories,
       q.timezones AS quiet_timezones, q.starts AS quiet_starts, q.ends AS quiet_ends
FROM quiet q
WHERE (SELECT count(*) FROM recipient_locks) >= 0

-- name: claim_admit_candidates
-- Step 2 of a claim: of the locked candidates, admit those within their recipient's rolling
-- window and mark them PROCESSING with a fresh claim token, a lease and one more attempt (an
-- attempt counts when claimed, so a notification that crashes every worker still runs out).
-- The others stay PENDING, due at the moment a slot frees (the matching oldest slot's time plus
-- the window), with no attempt used. Admitted rows take a slot now, in this transaction.
-- Rows quiet hours hold (quiet_ids, decided by the worker from step 1) are admitted without
-- a slot and outside the ranking: the send-time check defers them in this same transaction, so
-- they must not take a place in the window from a sendable row of the same recipient.
--
-- Admitted rows are bound to a provider in the same UPDATE: while a row is unfinished its
-- `provider` column is its binding (no column of its own: 0.1.0 reads this table with `*` in
-- prepared statements, which a new column breaks; docs/upgrading.md). A row already bound
-- keeps its provider (an earlier attempt there has an unknown outcome: the worker reads the old
-- value as `sticky_provider` and, under OnDefiniteFailure, calls no other); an unbound row is
-- bound to the head of its chain (its policy's first provider this worker knows, else the
-- channel's chain head, both passed by the worker), the provider the worker calls first unless
-- its circuit or its rate limit says no (then the worker writes the other one before calling).
--
-- Cost per row is what limits throughput, so: each row is found through the primary key
-- (`id = ANY(array)`, never a join the planner could turn into a scan of the whole table, which
-- would make a claim's cost grow with the table), the window's slots are counted once per
-- distinct recipient, and the moment a slot frees is looked up only for rows that must wait.
WITH batch AS (
    SELECT n.id, n.recipient, n.priority, n.next_attempt_at, n.created_at,
           COALESCE(p.rate_limit, %(rate_limit)s) AS rate_limit,
           make_interval(secs => COALESCE(p.rate_window_seconds, %(rate_window_seconds)s)) AS win,
           -- A row whose lease was recovered after a crash still holds the slot its lost attempt
           -- took. That slot stands for the one delivery its key can make (the re-check goes out
           -- with the same idempotency key), so the row is admitted on it (renewing it) and does
           -- not compete for another: it must not wait a whole window behind its own slot.
           EXISTS (SELECT 1 FROM nq_rate_slots s
                   WHERE s.notification_id = n.id
                     AND s.taken_at > now() - make_interval(
                         secs => COALESCE(p.rate_window_seconds, %(rate_window_seconds)s))) AS holds_slot,
           -- Policies fail closed (migration 0006): a row whose NotificationPolicy exists but is
           -- not Ready is held, never sent under the defaults. No policy row: the defaults.
           COALESCE(NOT p.ready, false) AS held,
           n.id = ANY(%(quiet_ids)b::uuid[]) AS quiet,
           n.provider AS sticky_provider,
           COALESCE(
               (SELECT u.name FROM unnest(p.providers) WITH ORDINALITY AS u(name, position)
                WHERE u.name = ANY(%(known_providers)b::text[]) ORDER BY u.position LIMIT 1),
               (SELECT c.head FROM unnest(%(chain_channels)b::text[], %(chain_heads)b::text[])
                    AS c(channel, head)
                WHERE c.channel = n.channel)) AS chain_head
    FROM nq_queue n
    LEFT JOIN nq_policies p ON p.name = n.policy
    WHERE n.id = ANY(%(ids)b::uuid[])
), recipients AS (
    -- Slots in the window per recipient (and window: a policy may set its own).
    SELECT r.recipient, r.win,
           (SELECT count(*) FROM nq_rate_slots s
            WHERE s.recipient = r.recipient AND s.taken_at > now() - r.win) AS used
    FROM (SELECT DISTINCT recipient, win FROM batch) r
), decided AS (
    SELECT b.id, b.recipient, b.win, u.used, b.rate_limit, b.holds_slot, b.held, b.quiet,
           b.sticky_provider, b.chain_head,
           -- Held and quiet rows rank apart, so they never take a place in the window from a
           -- sendable row.
           row_number() OVER (PARTITION BY b.recipient, b.holds_slot, b.held, b.quiet
                              ORDER BY b.priority, b.next_attempt_at, b.created_at) AS rank
    FROM batch b JOIN recipients u ON u.recipient = b.recipient AND u.win = b.win
), admitted AS (
    UPDATE nq_queue n
    SET status = 'PROCESSING',
        attempt_count = n.attempt_count + 1,
        claim_token = gen_random_uuid(),
        lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
        provider = COALESCE(n.provider, d.chain_head),
        updated_at = now()
    FROM decided d
    -- These rows are locked by step 1 of this transaction, so they are still PENDING. Found
    -- through the primary key, then matched to their decision (as `deferred` below).
    WHERE n.id = ANY(ARRAY(SELECT id FROM decided
                           WHERE NOT held AND (quiet OR holds_slot OR rank <= rate_limit - used)))
      AND n.id = d.id
    RETURNING n.id, n.claim_token, n.channel, n.recipient, n.subject, n.body, n.metadata,
              n.attempt_count, n.max_attempts, n.priority, n.policy, n.next_attempt_at, n.created_at,
              n.category, n.expires_at, n.recipient_id, n.provider AS bound_provider,
              d.sticky_provider, n.send_at
), waiting AS (
    -- The slot a waiting row waits for is the (used - limit + rank)-th oldest in the window;
    -- when that slot is not taken yet (a burst within one batch), a full window from now.
    SELECT d.id,
           COALESCE((SELECT s.taken_at FROM nq_rate_slots s
                     WHERE s.recipient = d.recipient AND s.taken_at > now() - d.win
                     ORDER BY s.taken_at
                     OFFSET GREATEST(d.used - d.rate_limit + d.rank - 1, 0) LIMIT 1),
                    now()) + d.win AS slot_frees_at
    FROM decided d
    WHERE NOT d.held AND NOT d.quiet AND NOT d.holds_slot AND d.rank > d.rate_limit - d.used
), held_back AS (
    -- Held by a policy that is not Ready: look again in 30 s, no attempt used, nothing returned
    -- (not a rate-limit deferral). Moving it out of the claim index's head keeps claims cheap
    -- and the worker from waking for it; the operator shows it as Reconciling/PolicyNotReady.
    UPDATE nq_queue n
    SET next_attempt_at = now() + interval '30 seconds', updated_at = now()
    WHERE n.id = ANY(ARRAY(SELECT id FROM decided WHERE held))
), deferred AS (
    UPDATE nq_queue n
    SET next_attempt_at = w.slot_frees_at, updated_at = now()
    FROM waiting w
    WHERE n.id = ANY(ARRAY(SELECT id FROM waiting)) AND n.id = w.id
    RETURNING n.id, n.channel
), slots AS (
    INSERT INTO nq_rate_slots (notification_id, recipient, taken_at)
    SELECT a.id, a.recipient, now() FROM admitted a WHERE NOT a.id = ANY(%(quiet_ids)b::uuid[])
    ON CONFLICT (notification_id) DO UPDATE SET recipient = excluded.recipient, taken_at = excluded.taken_at
)
-- The columns are read by position (repositories/delivery.py `_claimed`, binary, a tuple per
-- row); keep the two in step. Claim order, so the worker starts the most urgent deliveries first.
SELECT admitted, id, claim_token, channel, recipient, subject, body, metadata, attempt_count,
       max_attempts, priority, backoff_base_seconds, backoff_max_seconds, failover, providers,
       category, expires_at, recipient_id, recipient_exists, timezone, opt_out_all,
       opt_out_channels, opt_out_categories, quiet_start, quiet_end, bound_provider,
       sticky_provider, send_at
FROM (
    SELECT true AS admitted, a.id, a.claim_token, a.channel, a.recipient, a.subject, a.body,
           a.metadata, a.attempt_count, a.max_attempts, a.priority,
           COALESCE(p.backoff_base_seconds, %(backoff_base_seconds)s) AS backoff_base_seconds,
           COALESCE(p.backoff_max_seconds, %(backoff_max_seconds)s) AS backoff_max_seconds,
           p.failover, p.providers,
           a.next_attempt_at, a.created_at, a.category, a.expires_at, a.recipient_id,
           -- A user-targeted notification carries its recipient's preferences as of this claim,
           -- read in this transaction (a primary-key lookup), so the send-time check (services/
           -- preferences.py) never works from a stale copy. A deleted recipient reads as absent.
           r.id IS NOT NULL AS recipient_exists, r.timezone, r.opt_out_all, r.opt_out_channels,
           r.opt_out_categories, r.quiet_start, r.quiet_end, a.bound_provider, a.sticky_provider,
           -- When it first became due: the worker's due-to-sent latency histogram starts here.
           a.send_at
    FROM admitted a LEFT JOIN nq_policies p ON p.name = a.policy
    LEFT JOIN nq_recipients r ON r.id = a.recipient_id
    UNION ALL
    -- Waiting for a slot: the worker only counts these, by channel.
    SELECT false, d.id, NULL, d.channel, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
           NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
           NULL, NULL, NULL
    FROM deferred d
) c
ORDER BY priority, next_attempt_at, created_at

-- name: complete_deliveries
-- Record a batch of results in one statement: the status change, its webhook event (same
-- statement, same transaction: the outbox) and the rate-limit slot (kept when SENT, given back
-- otherwise, since nothing reached the recipient). A result is accepted only from the holder of
-- the current claim token of a PROCESSING row; a late result from a worker whose lease expired
-- matches nothing and is dropped (its id is absent from the result). The attempt's provider calls
-- are appended to delivery_attempts, keeping the last 20; when no provider was tried (all open or
-- rate-limited) the attempt the claim counted is given back.
-- The send-time preference check records here too, right after the claim and in its
-- transaction: SUPPRESSED, EXPIRED, or back to PENDING at the end of quiet hours (an absolute
-- next_attempt_at), each giving back the attempt the claim counted (give_back).
-- A provider's 410 (address_gone) removes that push token from the stored recipient.
-- Each result says which provider the row stays bound to (kept in `provider`): the one whose
-- outcome is unknown, else NULL; a SENT row's `provider` is the one that sent it (the binding
-- then, since a row is bound before its call); the send-time check passes the binding the row had before its claim.
-- The attempts come as one JSON array of arrays, matched to the results by position: a jsonb[]
-- parameter would be dumped element by element with every quote escaped, the costliest part of
-- the statement's parameters on the worker's side.
WITH results AS (
    SELECT r.*, a.attempts FROM unnest(
        %(ids)b::uuid[], %(claim_tokens)b::uuid[], %(statuses)b::text[],
        %(retry_in_seconds)b::float8[], %(last_errors)b::text[],
        %(provider_message_ids)b::text[], %(providers)b::text[],
        %(give_back)b::bool[], %(next_attempt_ats)b::timestamptz[], %(addresses_gone)b::bool[],
        %(bound_providers)b::text[]
    ) WITH ORDINALITY AS r(id, claim_token, status, retry_in_seconds, last_error,
                           provider_message_id, provider, give_back, next_attempt_at,
                           address_gone, bound_provider, position)
    JOIN jsonb_array_elements(%(attempts)s::jsonb) WITH ORDINALITY AS a(attempts, position)
      USING (position)
), updated AS (
    UPDATE nq_queue n
    SET status = r.status,
        next_attempt_at = COALESCE(r.next_attempt_at,
                                   now() + make_interval(secs => r.retry_in_seconds),
                                   n.next_attempt_at),
        last_error = r.last_error,
        provider_message_id = COALESCE(r.provider_message_id, n.provider_message_id),
        provider = CASE WHEN r.status = 'SENT' THEN r.provider ELSE r.bound_provider END,
        delivery_attempts = CASE
            WHEN jsonb_array_length(n.delivery_attempts) + jsonb_array_length(r.attempts) <= 20
            THEN n.delivery_attempts || r.attempts
            ELSE (SELECT jsonb_agg(a.value ORDER BY a.ordinality)
                  FROM jsonb_array_elements(n.delivery_attempts || r.attempts) WITH ORDINALITY a
                  WHERE a.ordinality > jsonb_array_length(n.delivery_attempts)
                                       + jsonb_array_length(r.attempts) - 20)
        END,
        attempt_count = n.attempt_count - CASE WHEN r.give_back THEN 1 ELSE 0 END,
        sent_at = CASE WHEN r.status = 'SENT' THEN now() ELSE n.sent_at END,
        finished_at = CASE WHEN r.status = 'PENDING' THEN NULL ELSE now() END,
        claim_token = NULL,
        lease_expires_at = NULL,
        updated_at = now()
    FROM results r
    -- Through the primary key (`= ANY`), so the cost is per result, never per PROCESSING row.
    WHERE n.id = ANY(%(ids)b::uuid[])
      AND n.id = r.id AND n.claim_token = r.claim_token AND n.status = 'PROCESSING'
    RETURNING n.id, n.status, n.attempt_count, n.webhook_url, n.policy, r.provider,
              r.address_gone, n.channel, n.recipient, n.recipient_id
), gone_tokens AS (
    -- One row per recipient (an UPDATE ... FROM applies one joined row per target row).
    UPDATE nq_recipients rc
    SET push_tokens = ARRAY(SELECT t FROM unnest(rc.push_tokens) t WHERE t <> ALL(g.tokens)),
        updated_at = now()
    FROM (SELECT recipient_id, array_agg(recipient) AS tokens FROM updated
          WHERE address_gone AND channel = 'push' AND recipient_id IS NOT NULL
          GROUP BY recipient_id) g
    WHERE rc.id = g.recipient_id
), events AS (
    SELECT nq_insert_webhook_events(array_agg(id), array_agg(status), array_agg(attempt_count),
                                    array_agg(webhook_url), array_agg(policy),
                                    %(default_webhook_url)s, array_agg(provider)) AS n
    FROM updated
), released AS (
    -- By primary key (`= ANY`): a join here could be planned as a scan of every slot.
    DELETE FROM nq_rate_slots s
    WHERE s.notification_id = ANY(ARRAY(SELECT id FROM updated WHERE status <> 'SENT'))
)
-- events is read here (once, as an init plan) so that its insert runs: a plain SELECT in WITH
-- is evaluated only when referenced. One row: the ids accepted, as an array.
SELECT ARRAY(SELECT id FROM updated) AS accepted, (SELECT n FROM events) AS events_written

-- name: release_claims
-- Graceful shutdown: hand claimed-but-unsent notifications back at once, giving back the attempt
-- the claim counted and the rate-limit slot it took (the notification was never tried).
WITH released AS (
    UPDATE nq_queue n
    SET status = 'PENDING', attempt_count = n.attempt_count - 1, next_attempt_at = now(),
        claim_token = NULL, lease_expires_at = NULL, updated_at = now()
    FROM unnest(%(ids)b::uuid[], %(claim_tokens)b::uuid[]) AS r(id, claim_token)
    WHERE n.id = r.id AND n.claim_token = r.claim_token AND n.status = 'PROCESSING'
    RETURNING n.id
), slots AS (
    DELETE FROM nq_rate_slots s WHERE s.notification_id = ANY(ARRAY(SELECT id FROM released))
)
SELECT count(*) AS released FROM released

-- name: recover_expired_leases
-- A lease that ran out means its worker died (or hangs): put the notification back to be tried
-- again with the same idempotency key. The attempt stays counted. A crash on the last attempt
-- gets one final re-check (attempt max+1, same key: a provider that already delivered it says so);
-- a crash during that re-check dead-letters it, so a poison notification never loops.
-- SKIP LOCKED: several workers may run this at once; each row is recovered once.
WITH expired AS (
    SELECT id FROM nq_queue
    WHERE status = 'PROCESSING' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), updated AS (
    UPDATE nq_queue n
    SET status = CASE WHEN n.attempt_count > n.max_attempts THEN 'DEAD_LETTERED' ELSE 'PENDING' END,
        finished_at = CASE WHEN n.attempt_count > n.max_attempts THEN now() END,
        last_error = 'lease expired during attempt ' || n.attempt_count || ' (worker lost)',
        next_attempt_at = now(),
        claim_token = NULL,
        lease_expires_at = NULL,
        updated_at = now()
    FROM expired e
    WHERE n.id = e.id
    RETURNING n.id, n.status, n.attempt_count, n.webhook_url, n.policy
), events AS (
    SELECT nq_insert_webhook_events(array_agg(id), array_agg(status), array_agg(attempt_count),
                                    array_agg(webhook_url), array_agg(policy),
                                    %(default_webhook_url)s) AS n
    FROM updated
)
SELECT count(*) AS recovered,
       count(*) FILTER (WHERE u.status = 'DEAD_LETTERED') AS dead_lettered,
       (SELECT n FROM events) AS events_written
FROM updated u

-- name: expire_overdue
-- PENDING notifications whose expiresAt passed become EXPIRED, with their webhook event.
WITH overdue AS (
    SELECT id FROM nq_queue
    WHERE status = 'PENDING' AND expires_at IS NOT NULL AND expires_at <= now()
    ORDER BY expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), updated AS (
    UPDATE nq_queue n
    SET status = 'EXPIRED', finished_at = now(), updated_at = now(),
        last_error = COALESCE(n.last_error, 'expired before it could be sent')
    FROM overdue o
    WHERE n.id = o.id
    RETURNING n.id, n.status, n.attempt_count, n.webhook_url, n.policy
), events AS (
    SELECT nq_insert_webhook_events(array_agg(id), array_agg(status), array_agg(attempt_count),
                                    array_agg(webhook_url), array_agg(policy),
                                    %(default_webhook_url)s) AS n
    FROM updated
)
SELECT count(*) AS expired, (SELECT n FROM events) AS events_written FROM updated u

-- name: next_due_at
-- When this worker's lanes next have work it can claim: the first row of each priority's range of
-- the claim index that passes the claim's own filter (its channels, not expired), so a worker can
-- sleep exactly until a scheduled notification is due instead of a poll. The filters must stay
-- those of claim_lock_candidates: a row this query counts but the claim skips (an sms for an
-- email-only worker, an expired row housekeeping has not reached yet) would say "due now" forever
-- and the worker would spin. Rows of other channels ahead of the first match are read and skipped
-- once per wake-up, not once per loop.
SELECT min(first_due) AS next_due_at, now() AS now
FROM unnest(%(priorities)b::smallint[]) AS lane(priority)
CROSS JOIN LATERAL (
    SELECT next_attempt_at AS first_due FROM nq_queue
    WHERE status = 'PENDING' AND priority = lane.priority
      AND channel = ANY(%(channels)b::text[])
      AND (expires_at IS NULL OR expires_at > now())
    ORDER BY next_attempt_at
    LIMIT 1
) f

-- name: prune_rate_slots
-- Slots older than the longest window in use (the default's or any policy's) count for nothing;
-- delete them in bounded chunks so one run never holds many row locks.
DELETE FROM nq_rate_slots
WHERE notification_id IN (
    SELECT notification_id FROM nq_rate_slots
    WHERE taken_at < now() - make_interval(secs => GREATEST(
        %(default_window_seconds)s,
        (SELECT COALESCE(max(rate_window_seconds), 0) FROM nq_policies)))
    LIMIT %(limit)s
)
