-- The claim, top-down. Two ways in:
-- - one call in autocommit (`p_ids` NULL): lock due candidates (nq_claim_lock_v2), then admit them,
--   unless one is user-targeted: then one row with `screen` true and nothing admitted (the locks
--   go with this call); the worker claims in its own transaction, where it decides quiet hours
--   and the send-time check. No candidate: no row.
-- - the admission of the candidates a worker's transaction locked with nq_claim_lock_v2 (`p_ids`,
--   and `p_quiet_ids` among them, which the worker decided quiet hours hold).
-- The admission: admit the rows within their recipient's rolling window and their channel's
-- where their policy limits it (PROCESSING, a lease,
-- one more attempt, bound to a provider), defer the others to when a place frees, hold those of
-- a policy that is not Ready, close or park digests, cancel acknowledged escalation steps; the
-- admitted rows come back in claim order, each with the channels the claim deferred (one row of
-- NULLs and those channels when nothing was admitted) and its address's suppression reason
-- (NULL when it is not on the list). Quiet rows are admitted without a place
-- in the window: the send-time check defers them in the same transaction.
-- The rules are fragments shared with the Citus claim (sql/delivery.sql, "The claim's rules").
-- Rows are found through the primary key (`id = ANY(array)`, or a nested loop from the batch's
-- ids), so a claim costs per row, never per table size: the drain's plan settings are the
-- function's attributes (docs/performance.md).
CREATE OR REPLACE FUNCTION nq_claim_v2(
    p_priorities smallint[], p_channels text[], p_limit integer, p_aging_seconds float8,
    p_claim_token uuid, p_rate_limit integer, p_rate_window_seconds float8,
    p_lease_seconds float8, p_backoff_base_seconds float8, p_backoff_max_seconds float8,
    p_chain_channels text[], p_chain_heads text[], p_known_providers text[], p_webhook_url text,
    p_ids uuid[] DEFAULT NULL, p_quiet_ids uuid[] DEFAULT '{}')
RETURNS TABLE (
    screen boolean, deferred_channels text[], status_writes_noted integer,
    escalation_steps_stopped integer,
    {{_claimed_columns}}, suppressed text)
{{_drain_function}}
#variable_conflict use_column
DECLARE
    v_ids uuid[] := p_ids;
    locked record;
    v_admitted uuid[];
    v_sticky text[];
    v_deferred text[];
    v_acknowledged uuid[];
    v_kube_ids uuid[];
    v_kube_new text[];
    v_stopped integer;
    v_noted integer;
BEGIN
    -- Lock (the one call only): the due candidates and their recipients' locks.
    IF v_ids IS NULL THEN
        SELECT * INTO locked
        FROM nq_claim_lock_v2(p_priorities, p_channels, p_limit, p_aging_seconds);
        IF cardinality(locked.ids) = 0 THEN
            RETURN;
        END IF;
        -- A user-targeted candidate: its quiet hours and send-time check are the worker's to
        -- decide, in the transaction of the claim.
        IF locked.targeted THEN
            screen := true;
            RETURN NEXT;
            RETURN;
        END IF;
        v_ids := locked.ids;
    END IF;

    -- Admit, defer, hold, park: one statement, whose snapshot (taken after the recipients'
    -- locks) sees the windows a worker we waited for committed. Its answer is what the steps
    -- after it need.
    WITH batch_all AS (
        SELECT n.id, n.bucket, n.recipient, n.priority, n.next_attempt_at, n.created_at, n.source,
               n.attempt_count, n.digest_id,
               {{_claim_limits}}
               -- ESCALATION GUARD (docs/escalation.md): a step whose escalation is acknowledged is
               -- not handed out but cancelled (below). Read from this statement's snapshot, never
               -- locked: an acknowledgement committed before it started is seen; one not yet
               -- committed waits for these rows (it locks the escalation, then its steps), so the
               -- step goes out only if it was due before that acknowledgement commits.
               CASE WHEN n.escalation_id IS NULL THEN false
                    ELSE EXISTS (SELECT 1 FROM nq_escalations e
                                 WHERE e.bucket = n.bucket AND e.id = n.escalation_id
                                   AND e.acknowledged_at IS NOT NULL) END AS acknowledged,
               n.provider AS sticky_provider,
               {{_claim_chain_head}}
        FROM nq_jobs n
        LEFT JOIN nq_policies p ON p.name = n.policy
        WHERE n.id = ANY(v_ids)
    ), digest_locked AS (
        -- [digests] docs/digests.md. The batch's digests, SKIP LOCKED: a create joining a digest
        -- or a cancel leaving it holds it a moment, its item is looked at again in a second (no
        -- wait, so no lock order between items and digests). An item whose carrier left the queue
        -- without sending it (its lease lost on the last attempt) takes over: `orphaned`.
        SELECT d.bucket, d.id, d.carrier_id,
               NOT EXISTS (SELECT 1 FROM nq_jobs j
                           WHERE j.bucket = d.bucket AND j.id = d.carrier_id) AS orphaned
        FROM nq_digests d
        WHERE d.bucket = ANY(ARRAY(SELECT bucket FROM batch_all WHERE digest_id IS NOT NULL))
          AND d.id = ANY(ARRAY(SELECT digest_id FROM batch_all WHERE digest_id IS NOT NULL))
        FOR UPDATE SKIP LOCKED
    ), digest_roles AS (
        {{_claim_digest_roles}}
    ), windows AS (
        -- Per recipient and window length (a policy may set its own): the entries in the window,
        -- read by primary key through a LATERAL; counted only where there is a window.
        SELECT r.bucket, r.recipient, r.win, COALESCE(w.ids, '{}') AS ids,
               COALESCE(w.taken, '{}') AS taken, COALESCE(w.channels, '{}') AS channels,
               {{_claim_window_used}},
               w.ids IS NOT NULL AS present
        FROM (SELECT DISTINCT bucket, recipient, win FROM batch) r
        LEFT JOIN LATERAL (
            SELECT ids, taken, channels FROM nq_rate_windows w
            WHERE w.bucket = r.bucket AND w.recipient = r.recipient
        ) w ON true
    ), decided AS (
        SELECT b.id, b.bucket, b.recipient, b.win, w.used, w.taken, b.rate_limit, b.held, b.quiet,
               b.acknowledged, b.source, b.attempt_count, b.sticky_provider, b.chain_head,
               b.priority, b.next_attempt_at, b.created_at, w.present,
               b.channel, b.channel_limit, b.channel_win, w.channels,
               {{_claim_channel_used}},
               {{_claim_holds_slot}}
        FROM batch b JOIN windows w USING (bucket, recipient, win)
    ), channel_ranked AS (
        -- From `decided` alone, never joined back to `batch` on id (a generic plan made that a
        -- nested loop of every decision against every row).
        SELECT d.*, {{_claim_channel_rank}}
        FROM decided d
    ), ranked AS (
        SELECT d.*, {{_claim_rank}}
        FROM channel_ranked d
    ), admitted AS (
        UPDATE nq_jobs n
        {{_claim_admitted}}
        FROM ranked r
        -- One primary-key probe per decision (a nested loop from `ranked`); the rows are locked
        -- by the lock step of this transaction, so still PENDING.
        WHERE n.id = r.id
          AND {{_claim_admits}}
        RETURNING n.id, n.bucket, n.recipient, n.channel, n.source, n.priority, n.next_attempt_at,
                  n.created_at, r.sticky_provider, r.quiet, r.present
    ), waiting AS (
        {{_claim_waiting}}
    ), held_back AS (
        UPDATE nq_jobs n
        {{_claim_policy_not_ready}}
        WHERE n.id = ANY(ARRAY(SELECT id FROM ranked WHERE held AND NOT acknowledged))
        RETURNING n.id, n.source
    ), deferred AS (
        UPDATE nq_jobs n
        {{_claim_rate_limited}}
        FROM waiting w
        WHERE n.id = w.id
        RETURNING n.id, n.channel, n.source
    ), opened AS (
        -- Admitted rows that send take their place. A recipient without a window gets one by a
        -- plain insert (windows are made only here, under the recipient's lock, so none appears
        -- between this statement's read and this write; an upsert's speculative insert writes
        -- more WAL). A prune meanwhile only removes a window read as present, which `windowed`
        -- inserts again.
        INSERT INTO nq_rate_windows (bucket, recipient, ids, taken, channels, last_taken_at)
        SELECT a.bucket, a.recipient, array_agg(a.id), array_agg(now()), array_agg(a.channel), now()
        FROM admitted a WHERE NOT a.quiet AND NOT a.present
        GROUP BY a.bucket, a.recipient
    ), windowed AS (
        -- A window read as present is rewritten (a row holding its place renews it), dropping
        -- entries no window in use counts any more; in (bucket, recipient) order, the order every
        -- writer of windows locks them in.
        INSERT INTO nq_rate_windows AS w (bucket, recipient, ids, taken, channels, last_taken_at)
        SELECT a.bucket, a.recipient, array_agg(a.id), array_agg(now()), array_agg(a.channel), now()
        FROM admitted a WHERE NOT a.quiet AND a.present
        GROUP BY a.bucket, a.recipient
        ORDER BY a.bucket, a.recipient
        ON CONFLICT (bucket, recipient) DO UPDATE
        SET (ids, taken, channels) = (
                SELECT array_agg(e.id ORDER BY e.t, e.id), array_agg(e.t ORDER BY e.t, e.id),
                       array_agg(e.c ORDER BY e.t, e.id)
                FROM (SELECT o.id, o.t, o.c FROM unnest(w.ids, w.taken, w.channels) AS o(id, t, c)
                      WHERE o.t > now() - make_interval(secs => (
                          SELECT GREATEST(p_rate_window_seconds,
                                          COALESCE(max({{_policy_longest_window}}), 0))
                          FROM nq_policies p))
                        AND o.id <> ALL(excluded.ids)
                      UNION ALL
                      SELECT x.id, x.t, x.c
                      FROM unnest(excluded.ids, excluded.taken, excluded.channels)
                           AS x(id, t, c)) e),
            last_taken_at = now()
    ), digest_closed AS (
        -- [digests] A claimed carrier closes its digest: a create from now on opens a new one;
        -- the carrier sends every item that joined before. An item taking over an orphaned
        -- digest closes it again (retention counts from the last close).
        UPDATE nq_digests d
        SET state = 'closed', closed_at = now(), carrier_id = r.id
        FROM digest_roles r
        WHERE d.bucket = ANY(ARRAY(SELECT bucket FROM digest_roles WHERE role = 'carrier'))
          AND d.id = ANY(ARRAY(SELECT digest_id FROM digest_roles WHERE role = 'carrier'))
          AND d.bucket = r.bucket AND d.id = r.digest_id AND r.role = 'carrier'
    ), digest_parked AS (
        UPDATE nq_jobs n
        {{_claim_digest_parked}}
        FROM digest_roles r
        WHERE n.id = r.id AND r.role <> 'carrier'
        RETURNING n.id, n.source
    )
    SELECT a.ids, a.sticky, ARRAY(SELECT channel FROM deferred),
           ARRAY(SELECT id FROM ranked WHERE acknowledged), k.ids, k.new_statuses
    INTO v_admitted, v_sticky, v_deferred, v_acknowledged, v_kube_ids, v_kube_new
    FROM (SELECT array_agg(id ORDER BY priority, next_attempt_at, created_at, id) AS ids,
                 array_agg(sticky_provider ORDER BY priority, next_attempt_at, created_at, id)
                     AS sticky
          FROM admitted) a,
         (SELECT array_agg(c.id) AS ids, array_agg(c.new_status) AS new_statuses
          FROM (SELECT id, source, 'PROCESSING' AS new_status FROM admitted
                UNION ALL SELECT id, source, 'PENDING' FROM held_back
                UNION ALL SELECT id, source, 'PENDING' FROM deferred
                UNION ALL SELECT id, source, 'PENDING' FROM digest_parked) c
          WHERE c.source = 'kubernetes') k;

    -- ESCALATION GUARD: acknowledged steps end CANCELLED, `acknowledged` (nq_finish_held moves
    -- them to the log). Only when there are some.
    IF cardinality(v_acknowledged) > 0 THEN
        SELECT count(*) INTO v_stopped
        FROM nq_finish_held(
            v_acknowledged, NULL,
            array_fill('CANCELLED'::text, ARRAY[cardinality(v_acknowledged)]),
            array_fill('acknowledged'::text, ARRAY[cardinality(v_acknowledged)]),
            NULL, NULL, NULL, NULL, p_webhook_url);
    END IF;

    -- Kubernetes rows' status writes (claimed, deferred, held, parked: the counters do not
    -- change, nothing finished). Only when there are some.
    IF v_kube_ids IS NOT NULL THEN
        v_noted := nq_note_changes(
            v_kube_ids, array_fill('kubernetes'::text, ARRAY[cardinality(v_kube_ids)]),
            array_fill('PENDING'::text, ARRAY[cardinality(v_kube_ids)]), v_kube_new);
    END IF;

    -- The admitted rows in claim order (the most urgent deliveries start first), with what the
    -- worker sends them with: the policy's backoff and providers, and the recipient's preferences
    -- as of this claim (a primary-key lookup; a deleted recipient reads as absent), so the
    -- send-time check (services/preferences.py) never works from a stale copy.
    IF v_admitted IS NOT NULL THEN
        RETURN QUERY
        SELECT false, v_deferred, v_noted, v_stopped,
               n.id, n.channel, n.recipient, n.subject, n.body, n.metadata, n.attempt_count,
               n.max_attempts, n.priority,
               COALESCE(p.backoff_base_seconds, p_backoff_base_seconds),
               COALESCE(p.backoff_max_seconds, p_backoff_max_seconds),
               p.failover, p.providers, n.category, n.expires_at, n.recipient_id,
               r.id IS NOT NULL, r.timezone, r.opt_out_all, r.opt_out_channels,
               r.opt_out_categories, r.quiet_start, r.quiet_end, n.provider, a.sticky_provider,
               n.next_attempt_at, n.created_at,
               -- When it first became due: the worker's due-to-sent latency starts here.
               n.send_at,
               -- The creator's trace context: the worker's delivery span continues that trace.
               n.traceparent,
               -- [digests] Set on a digest's carrier: the worker renders the digest.
               n.digest_id, n.bucket,
               -- The suppression list's reason for the address, NULL when it is not listed: the
               -- send-time check's one primary-key probe (docs/receipts.md).
               (SELECT s.reason FROM nq_suppressions s
                WHERE s.tenant = n.tenant AND s.channel = n.channel
                  AND s.address = nq_normalised_address(n.channel, n.recipient))
        FROM unnest(v_admitted, v_sticky) WITH ORDINALITY AS a(id, sticky_provider, position)
        JOIN nq_jobs n ON n.id = a.id
        LEFT JOIN nq_policies p ON p.name = n.policy
        LEFT JOIN nq_recipients r ON r.id = n.recipient_id
        ORDER BY a.position;
    ELSE
        screen := false;
        deferred_channels := v_deferred;
        status_writes_noted := v_noted;
        escalation_steps_stopped := v_stopped;
        RETURN NEXT;
    END IF;
END $$;
