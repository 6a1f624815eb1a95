-- The claim's steps as functions, and the claim of address-targeted rows in one call, so a claim is
-- one round trip. Expand only: two new functions; the previous release sends its own statements,
-- which read and write the same rows.
--
-- A claim was four round trips (its begin with the drain's settings, the lock step, the
-- admission, the commit; ~130-300 us of a worker's CPU each), in one transaction because the
-- worker decides between and after the statements: which candidates quiet hours hold (by the
-- recipient's time zone), and the send-time check of user-targeted rows (preferences, quiet
-- hours), whose decisions commit with the claim. Of a claim whose candidates are all
-- address-targeted, neither has anything to decide. nq_claim locks the candidates and, when none
-- is user-targeted, admits them, in one call in autocommit: one round trip. Otherwise it admits
-- nothing, says so (`screen`), and the worker claims in its transaction as before: nq_claim_lock,
-- then nq_claim with the candidates it locked. The statements are the ones delivery.sql held
-- (claim_lock_candidates, claim_admit_candidates with its digest fragment), unchanged but for
-- their parameters and the lock step's `targeted`.
--
-- Each statement of a VOLATILE PL/pgSQL function takes its own snapshot (READ COMMITTED): the
-- admission, run after the lock step in nq_claim as in the worker's transaction, sees the windows
-- committed by a worker whose recipient lock the lock step waited for. The drain's plan settings
-- are the functions' attributes (as nq_complete_deliveries', 0041), so every statement they run is
-- planned under them, once per connection.

-- Step 1 of a claim (in the worker's transaction, or inside nq_claim): lock up to p_limit due
-- notifications and the rate-limit locks of their recipients; say whether any is user-targeted.
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
CREATE FUNCTION nq_claim_lock(p_priorities smallint[], p_channels text[], p_limit integer)
RETURNS TABLE (
    ids uuid[], quiet_ids uuid[], quiet_priorities smallint[], quiet_categories text[],
    quiet_timezones text[], quiet_starts time[], quiet_ends time[], targeted boolean)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH candidates AS (
        SELECT n.id, n.recipient, n.recipient_id, n.priority, n.category
        FROM unnest(p_priorities::smallint[]) AS lane(priority)
        CROSS JOIN LATERAL (
            SELECT id, recipient, recipient_id, priority, category
            FROM nq_jobs
            WHERE status = 'PENDING'
              AND priority = lane.priority
              AND next_attempt_at <= now()
              AND channel = ANY(p_channels::text[])
              AND (expires_at IS NULL OR expires_at > now())
            ORDER BY next_attempt_at, created_at
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        ) n
        LIMIT p_limit
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
           q.timezones AS quiet_timezones, q.starts AS quiet_starts, q.ends AS quiet_ends,
           EXISTS (SELECT 1 FROM candidates c WHERE c.recipient_id IS NOT NULL) AS targeted
    FROM quiet q
    WHERE (SELECT count(*) FROM recipient_locks) >= 0;
END $$;

-- Step 2 of a claim: of the locked candidates, admit those within their recipient's rolling
-- window and mark them PROCESSING with the worker's claim token, a lease and one more attempt
-- (an attempt counts when claimed, so a notification that crashes every worker still runs out).
-- The others stay PENDING, due at the moment a place in the window frees (the matching oldest
-- entry's time plus the window), with no attempt used and `RecipientRateLimit` as the reason
-- they wait. Admitted rows take their place in the window now, in this transaction.
-- Rows quiet hours hold (quiet_ids, decided by the worker from step 1) are admitted without a
-- place and outside the ranking: the send-time check defers them in this same transaction, so
-- they must not take a place in the window from a sendable row of the same recipient.
--
-- The claim token comes from the worker (p_claim_token, one per claim: a claim is one batch of
-- one worker), not from gen_random_uuid(): Citus refuses volatile functions in a distributed
-- UPDATE, and one token per batch costs nothing per row. Completion matches (id, token).
--
-- Admitted rows are bound to a provider in the same UPDATE: while a row is unfinished its
-- `provider` column is its binding. A row already bound keeps its provider (an earlier attempt
-- there has an unknown outcome: the worker reads the old value as `sticky_provider` and, under
-- OnDefiniteFailure, calls no other); an unbound row is bound to the head of its chain (its
-- policy's first provider this worker knows, else the channel's chain head, both passed by the
-- worker), the provider the worker calls first unless its circuit or its rate limit says no.
--
-- The window is one row per recipient (nq_rate_windows, 0012): its entries (notification, time)
-- are counted per distinct recipient, read by primary key through a LATERAL (a nested loop per
-- recipient, never a join the planner could turn into a scan), and rewritten once per recipient
-- by an upsert in (bucket, recipient) order, the order every writer of windows locks them in.
-- Rows are found through the primary key (`id = ANY(array)`), so a claim costs per row, never per
-- table size, whatever the statistics say.
--
-- The claim in one function: step 2 of the candidates a caller's transaction locked (`p_ids`, and
-- `p_quiet_ids` among them, which the caller decided quiet hours hold; the lock step's parameters
-- are then not used), or, without `p_ids` (one call in autocommit), step 1 and then step 2 when
-- no candidate is user-targeted (no quiet hours to decide, no send-time check to commit with the
-- claim). A user-targeted candidate: one row with `screen` true and nothing admitted (the locks go
-- with this call's transaction; the caller claims in its own, where it can decide). No candidate:
-- no row. Otherwise the admitted rows with `screen` false. The admission is this function's own
-- statement, not a function of its own: each function level that returns the rows copies them
-- into a result store of its own (a nested one cost ~6 us per notification of PostgreSQL's time).
CREATE FUNCTION nq_claim(
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
    traceparent text, digest_id uuid, digest_bucket smallint)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_ids uuid[] := p_ids;
    locked record;
BEGIN
    IF v_ids IS NULL THEN
        SELECT * INTO locked FROM nq_claim_lock(p_priorities, p_channels, p_limit);
        IF cardinality(locked.ids) = 0 THEN
            RETURN;
        END IF;
        IF locked.targeted THEN
            screen := true;
            RETURN NEXT;
            RETURN;
        END IF;
        v_ids := locked.ids;
    END IF;
    RETURN QUERY
    WITH batch_all AS (
        SELECT n.id, n.bucket, n.recipient, n.priority, n.next_attempt_at, n.created_at, n.source,
               n.attempt_count, n.digest_id,
               COALESCE(p.rate_limit, p_rate_limit) AS rate_limit,
               make_interval(secs => COALESCE(p.rate_window_seconds, p_rate_window_seconds)) AS win,
               -- Policies fail closed (migration 0006): a row whose NotificationPolicy exists but is
               -- not Ready is held, never sent under the defaults. No policy row: the defaults.
               COALESCE(NOT p.ready, false) AS held,
               n.id = ANY(p_quiet_ids::uuid[]) AS quiet,
               -- ESCALATION GUARD (docs/escalation.md): a step whose escalation is acknowledged is
               -- not handed out but cancelled (`stopped`). Read from this statement's snapshot, never
               -- locked: an acknowledgement committed before it started is seen; one not yet
               -- committed waits for these rows (it locks the escalation, then its steps), so the
               -- step goes out only if it was due before that acknowledgement commits.
               CASE WHEN n.escalation_id IS NULL THEN false
                    ELSE EXISTS (SELECT 1 FROM nq_escalations e
                                 WHERE e.bucket = n.bucket AND e.id = n.escalation_id
                                   AND e.acknowledged_at IS NOT NULL) END AS acknowledged,
               n.provider AS sticky_provider,
               -- The policy's first provider this worker knows, else the channel's chain head. Each
               -- subquery here runs once per row: the policy's only for a row that has one, and the
               -- channel's head read by position, not by a subquery (1-2 us per row between them).
               COALESCE(
                   CASE WHEN p.providers IS NOT NULL THEN
                       (SELECT u.name FROM unnest(p.providers) WITH ORDINALITY AS u(name, position)
                        WHERE u.name = ANY(p_known_providers::text[]) ORDER BY u.position LIMIT 1)
                   END,
                   (p_chain_heads::text[])[array_position(p_chain_channels::text[], n.channel)])
                   AS chain_head
        FROM nq_jobs n
        LEFT JOIN nq_policies p ON p.name = n.policy
        WHERE n.id = ANY(v_ids::uuid[])
    ), digest_locked AS (
        -- [digests] docs/digests.md. The digests of the batch's items, through their primary key (a
        -- batch without digest items reads nothing), SKIP LOCKED: a create joining a digest or a
        -- cancel leaving it holds it for a moment, and its item is looked at again in a second.
        -- Never a wait here, so this side needs no lock order between items and digests. An item
        -- whose carrier has left the queue without sending it (its lease lost on the last attempt)
        -- takes over: `orphaned`.
        SELECT d.bucket, d.id, d.carrier_id,
               NOT EXISTS (SELECT 1 FROM nq_jobs j
                           WHERE j.bucket = d.bucket AND j.id = d.carrier_id) AS orphaned
        FROM nq_digests d
        WHERE d.bucket = ANY(ARRAY(SELECT bucket FROM batch_all WHERE digest_id IS NOT NULL))
          AND d.id = ANY(ARRAY(SELECT digest_id FROM batch_all WHERE digest_id IS NOT NULL))
        FOR UPDATE SKIP LOCKED
    ), digest_roles AS (
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
    ), windows AS (
        -- Per recipient and window length (a policy may set its own): the entries in the window.
        SELECT r.bucket, r.recipient, r.win, COALESCE(w.ids, '{}') AS ids,
               COALESCE(w.taken, '{}') AS taken,
               -- Counted only where there is a window: a recipient without one (the common case:
               -- most recipients get a few notifications a window) starts no subquery.
               CASE WHEN w.ids IS NULL THEN 0
                    ELSE (SELECT count(*) FROM unnest(w.taken) AS t WHERE t > now() - r.win) END
                   AS used,
               w.ids IS NOT NULL AS present
        FROM (SELECT DISTINCT bucket, recipient, win FROM batch) r
        LEFT JOIN LATERAL (
            SELECT ids, taken FROM nq_rate_windows w
            WHERE w.bucket = r.bucket AND w.recipient = r.recipient
        ) w ON true
    ), decided AS (
        SELECT b.id, b.bucket, b.recipient, b.win, w.used, w.taken, b.rate_limit, b.held, b.quiet,
               b.acknowledged, b.source, b.attempt_count, b.sticky_provider, b.chain_head,
               b.priority, b.next_attempt_at, b.created_at, w.present,
               -- A row whose lease was recovered after a crash still holds the place its lost
               -- attempt took. That place stands for the one delivery its key can make (the re-check
               -- goes out with the same idempotency key), so the row is admitted on it (renewing it)
               -- and does not compete for another: it must not wait a whole window behind itself.
               -- Looked for only in a window with entries in it (AND stops at the first false).
               w.used > 0 AND EXISTS (SELECT 1 FROM unnest(w.ids, w.taken) AS e(id, t)
                                      WHERE e.id = b.id AND e.t > now() - b.win) AS holds_slot
        FROM batch b JOIN windows w USING (bucket, recipient, win)
    ), ranked AS (
        SELECT d.*,
               -- Held and quiet rows rank apart, so they never take a place from a sendable row.
               row_number() OVER (PARTITION BY d.bucket, d.recipient, d.holds_slot, d.held, d.quiet,
                                               d.acknowledged
                                  ORDER BY d.priority, d.next_attempt_at, d.created_at) AS rank
        -- Ranked from `decided` alone, which carries the order's columns: not joined back to `batch`
        -- on id, a join of two CTEs that a generic plan (which takes `id = ANY($n)` for 10 rows)
        -- made a nested loop, every decision against every row (249,500 comparisons, 44 of 67 ms,
        -- in a claim of 500).
        FROM decided d
    ), admitted AS (
        UPDATE nq_jobs n
        SET status = 'PROCESSING',
            attempt_count = n.attempt_count + 1,
            claim_token = p_claim_token,
            lease_expires_at = now() + make_interval(secs => p_lease_seconds),
            provider = COALESCE(n.provider, r.chain_head),
            waiting_reason = NULL, waiting_until = NULL, waiting_detail = NULL,
            updated_at = now()
        FROM ranked r
        -- These rows are locked by step 1 of this transaction, so they are still PENDING. Each
        -- decision finds its row through the primary key: one probe per row (a nested loop from
        -- the decisions, which the planner takes for a CTE of a few rows). Not `n.id = ANY(ARRAY(
        -- SELECT id FROM ranked ...)) AND n.id = r.id`: the planner put that whole-batch index scan
        -- inside the loop, one scan of every id per decision (100 x 100 probes per claim of 100).
        WHERE n.id = r.id
          AND NOT r.held AND NOT r.acknowledged
          AND (r.quiet OR r.holds_slot OR r.rank <= r.rate_limit - r.used)
        RETURNING n.id, n.bucket, n.channel, n.recipient, n.subject, n.body, n.metadata,
                  n.attempt_count, n.max_attempts, n.priority, n.policy, n.next_attempt_at,
                  n.created_at, n.category, n.expires_at, n.recipient_id, n.source,
                  n.provider AS bound_provider, r.sticky_provider, r.quiet, n.send_at,
                  n.traceparent, n.digest_id, r.present
    ), waiting AS (
        -- The place a waiting row waits for is the (used - limit + rank)-th oldest entry in the
        -- window; when that one is not taken yet (a burst within one batch), a full window from now.
        SELECT r.id,
               COALESCE((SELECT t FROM unnest(r.taken) AS t
                         WHERE t > now() - r.win
                         ORDER BY t
                         OFFSET GREATEST(r.used - r.rate_limit + r.rank - 1, 0) LIMIT 1),
                        now()) + r.win AS frees_at,
               r.rate_limit, r.win
        FROM ranked r
        WHERE NOT r.held AND NOT r.quiet AND NOT r.holds_slot AND NOT r.acknowledged
          AND r.rank > r.rate_limit - r.used
    ), held_back AS (
        -- Held by a policy that is not Ready: look again in 30 s, no attempt used, nothing returned
        -- (not a rate-limit deferral). Moving it out of the claim index's head keeps claims cheap
        -- and the worker from waking for it; the operator shows it as Reconciling/PolicyNotReady.
        UPDATE nq_jobs n
        SET next_attempt_at = now() + interval '30 seconds',
            waiting_reason = 'PolicyNotReady', waiting_until = now() + interval '30 seconds',
            waiting_detail = 'policy ' || n.policy || ' is not Ready; looked at again every 30 s',
            updated_at = now()
        WHERE n.id = ANY(ARRAY(SELECT id FROM ranked WHERE held AND NOT acknowledged))
        RETURNING n.id, n.source
    ), deferred AS (
        UPDATE nq_jobs n
        SET next_attempt_at = w.frees_at, updated_at = now(),
            waiting_reason = 'RecipientRateLimit', waiting_until = w.frees_at,
            waiting_detail = 'recipient reached ' || w.rate_limit || ' per '
                             || extract(epoch FROM w.win)::bigint || ' s'
        FROM waiting w
        -- One primary-key probe per waiting row (as `admitted`).
        WHERE n.id = w.id
        RETURNING n.id, n.channel, n.source
    ), opened AS (
        -- Admitted rows that send take their place. A recipient without a window gets one by a plain
        -- insert: windows are created only here, under the recipient's advisory lock (step 1), so
        -- none can appear between this statement's read, whose snapshot was taken after the lock,
        -- and this write. Plain, not the upsert below: an upsert's insert is speculative and writes
        -- a confirmation record besides (48 B of WAL per new recipient). A prune deleting a window
        -- meanwhile (it takes no advisory lock) only ever removes one this statement read as
        -- present, which the upsert below then inserts again.
        INSERT INTO nq_rate_windows (bucket, recipient, ids, taken, last_taken_at)
        SELECT a.bucket, a.recipient, array_agg(a.id), array_agg(now()), now()
        FROM admitted a WHERE NOT a.quiet AND NOT a.present
        GROUP BY a.bucket, a.recipient
    ), windowed AS (
        -- A window read as present is rewritten (a row holding its place renews it); entries no
        -- window in use counts any more are dropped on the way. By upsert, in (bucket, recipient)
        -- order: the row locks every writer of windows takes in that order.
        INSERT INTO nq_rate_windows AS w (bucket, recipient, ids, taken, last_taken_at)
        SELECT a.bucket, a.recipient, array_agg(a.id), array_agg(now()), now()
        FROM admitted a WHERE NOT a.quiet AND a.present
        GROUP BY a.bucket, a.recipient
        ORDER BY a.bucket, a.recipient
        ON CONFLICT (bucket, recipient) DO UPDATE
        SET (ids, taken) = (
                SELECT array_agg(e.id ORDER BY e.t, e.id), array_agg(e.t ORDER BY e.t, e.id)
                FROM (SELECT o.id, o.t FROM unnest(w.ids, w.taken) AS o(id, t)
                      WHERE o.t > now() - make_interval(secs => (
                          SELECT GREATEST(p_rate_window_seconds, COALESCE(max(rate_window_seconds), 0))
                          FROM nq_policies))
                        AND o.id <> ALL(excluded.ids)
                      UNION ALL
                      SELECT x.id, x.t FROM unnest(excluded.ids, excluded.taken) AS x(id, t)) e),
            last_taken_at = now()
    ), digest_closed AS (
        -- [digests] A claimed carrier closes its digest: a create from now on opens a new one, and
        -- what the carrier sends is every item that joined before, read after this commits (a
        -- joining create held the digest until its commit, so none is missing). An item taking over
        -- an orphaned digest closes it again: retention counts from the last close.
        UPDATE nq_digests d
        SET state = 'closed', closed_at = now(), carrier_id = r.id
        FROM digest_roles r
        WHERE d.bucket = ANY(ARRAY(SELECT bucket FROM digest_roles WHERE role = 'carrier'))
          AND d.id = ANY(ARRAY(SELECT digest_id FROM digest_roles WHERE role = 'carrier'))
          AND d.bucket = r.bucket AND d.id = r.digest_id AND r.role = 'carrier'
        RETURNING d.id
    ), digest_parked AS (
        -- [digests] Parked a day (the carrier's result ends it before), or a second when busy.
        UPDATE nq_jobs n
        -- now() outside CASE, and CASE in its searched form: Citus refuses a non-immutable function
        -- inside CASE or COALESCE in a distributed UPDATE, and misplans `CASE x WHEN` (citus.sql).
        SET next_attempt_at = now() + CASE WHEN r.role = 'busy' THEN interval '1 second'
                                           ELSE interval '1 day' END,
            waiting_reason = 'DigestWindow',
            waiting_until = now() + CASE WHEN r.role = 'busy' THEN interval '1 second' END,
            waiting_detail = CASE WHEN r.role = 'busy' THEN 'its digest is being joined or left'
                                  ELSE 'sent with its digest' END,
            updated_at = now()
        FROM digest_roles r
        -- One primary-key probe per parked item (as `admitted`).
        WHERE n.id = r.id AND r.role <> 'carrier'
        RETURNING n.id, n.source
    ), stopped AS (
        -- ESCALATION GUARD: acknowledged steps (locked by step 1) become CANCELLED, `acknowledged`,
        -- through nq_finish_held. Called only when there are some: a claim without escalation steps
        -- pays one boolean per row, no function call.
        SELECT (SELECT count(*) FROM nq_finish_held(
                    ARRAY(SELECT id FROM ranked WHERE acknowledged), NULL,
                    ARRAY(SELECT 'CANCELLED' FROM ranked WHERE acknowledged),
                    ARRAY(SELECT 'acknowledged' FROM ranked WHERE acknowledged),
                    NULL, NULL, NULL, NULL, p_webhook_url)) AS n
        WHERE EXISTS (SELECT 1 FROM ranked WHERE acknowledged)
    ), noted AS (
        -- Kubernetes rows only: their status writes (the counters do not change: nothing finished).
        -- Called only when there are some (HAVING): a claim of API rows calls no function here.
        SELECT nq_note_changes(array_agg(c.id), array_agg(c.source), array_agg(c.old_status),
                               array_agg(c.new_status)) AS n
        FROM (SELECT id, source, 'PENDING' AS old_status, 'PROCESSING' AS new_status FROM admitted
              UNION ALL SELECT id, source, 'PENDING', 'PENDING' FROM held_back
              UNION ALL SELECT id, source, 'PENDING', 'PENDING' FROM deferred
              UNION ALL SELECT id, source, 'PENDING', 'PENDING' FROM digest_parked) c
        WHERE c.source = 'kubernetes'
        HAVING count(*) > 0
    )
    -- Admitted rows in claim order, so the worker starts the most urgent deliveries first; each
    -- carries the channels the claim deferred (the same on every row; one row of NULLs and the
    -- channels when nothing was admitted). noted is selected so that it runs: a column of `f` that
    -- the outer query does not select is removed by the planner, and with it the only reference to
    -- noted, which then never ran (no status write for a Kubernetes row's claim or deferral).
    SELECT false, f.deferred_channels, f.noted AS status_writes_noted,
           f.stopped::integer AS escalation_steps_stopped, a.*
    FROM (SELECT ARRAY(SELECT channel FROM deferred) AS deferred_channels,
                 (SELECT n FROM noted) AS noted, (SELECT n FROM stopped) AS stopped) f
    LEFT JOIN (
        SELECT a.id, a.channel, a.recipient, a.subject, a.body, a.metadata, a.attempt_count,
               a.max_attempts, a.priority,
               COALESCE(p.backoff_base_seconds, p_backoff_base_seconds) AS backoff_base_seconds,
               COALESCE(p.backoff_max_seconds, p_backoff_max_seconds) AS backoff_max_seconds,
               p.failover, p.providers, a.category, a.expires_at, a.recipient_id,
               -- A user-targeted notification carries its recipient's preferences as of this claim,
               -- read in this transaction (a primary-key lookup), so the send-time check (services/
               -- preferences.py) never works from a stale copy. A deleted recipient reads as absent.
               r.id IS NOT NULL AS recipient_exists, r.timezone, r.opt_out_all, r.opt_out_channels,
               r.opt_out_categories, r.quiet_start, r.quiet_end, a.bound_provider, a.sticky_provider,
               a.next_attempt_at, a.created_at,
               -- When it first became due: the worker's due-to-sent latency histogram starts here.
               a.send_at,
               -- The creator's trace context: the worker's delivery span continues that trace.
               a.traceparent,
               -- [digests] Set on a digest's carrier: the worker renders the digest (docs/digests.md).
               a.digest_id, a.bucket AS digest_bucket
        FROM admitted a LEFT JOIN nq_policies p ON p.name = a.policy
        LEFT JOIN nq_recipients r ON r.id = a.recipient_id
    ) a ON true
    ORDER BY a.priority, a.next_attempt_at, a.created_at;
END $$;
