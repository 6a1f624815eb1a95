-- A claim's first step (in the worker's transaction, or inside nq_claim_v2): lock up to p_limit
-- due notifications, the most urgent first (aged by p_aging_seconds: docs/design.md, "Aging"), and
-- their recipients' rate-limit locks; say whether any is user-targeted, and give the worker what
-- it needs to decide quiet hours for those whose stored recipient has them.
-- Each step is a statement of its own; each takes its snapshot after the one before (READ
-- COMMITTED, VOLATILE). The drain's plan settings are the function's attributes, so every
-- statement is planned under them once per connection.
CREATE OR REPLACE FUNCTION nq_claim_lock_v2(
    p_priorities smallint[], p_channels text[], p_limit integer, p_aging_seconds float8)
RETURNS TABLE (
    ids uuid[], quiet_ids uuid[], quiet_priorities smallint[], quiet_categories text[],
    quiet_timezones text[], quiet_starts time[], quiet_ends time[], targeted boolean)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_ids uuid[];
    v_recipients text[];
    v_recipient_ids text[];
    v_priorities smallint[];
    v_categories text[];
    v_lanes smallint[] := p_priorities;
    v_takes integer[] := array_fill(p_limit, ARRAY[cardinality(p_priorities)]);
BEGIN
    -- Aging: how many of each lane the batch takes, from each lane's head (its p_limit oldest due
    -- rows, read by the claim index without locks) ranked by aged priority. Within a lane the
    -- oldest rows rank first, so the batch's rows are among those heads: at most p_limit rows
    -- per lane are read and sorted, never the backlog. Without aging every lane may fill the
    -- batch and the outer LIMIT below keeps strict priority.
    IF p_aging_seconds > 0 THEN
        SELECT array_agg(lane.priority ORDER BY lane.priority),
               array_agg(COALESCE(t.take, 0) ORDER BY lane.priority)
        INTO v_lanes, v_takes
        FROM unnest(p_priorities) AS lane(priority)
        LEFT JOIN (
            SELECT h.priority, count(*)::integer AS take
            FROM (SELECT h.priority
                  FROM unnest(p_priorities) AS lane(priority)
                  CROSS JOIN LATERAL (
                      SELECT priority, next_attempt_at, created_at
                      FROM nq_jobs
                      WHERE status = 'PENDING'
                        AND priority = lane.priority
                        AND next_attempt_at <= now()
                        AND channel = ANY(p_channels)
                        AND (expires_at IS NULL OR expires_at > now())
                      ORDER BY next_attempt_at, created_at
                      LIMIT p_limit
                  ) h
                  ORDER BY {{_claim_aged_rank}}, h.next_attempt_at, h.created_at
                  LIMIT p_limit) h
            GROUP BY h.priority
        ) t ON t.priority = lane.priority;
    END IF;

    -- Candidates: per priority this worker serves, highest first, up to that lane's take of the
    -- head of its range of the claim index, FOR UPDATE SKIP LOCKED (another worker's rows are
    -- skipped, never waited for: it takes the rows after them). The LATERAL and the outer LIMIT
    -- read a lower priority only when the higher ones ran out. Expired rows are left to
    -- expire_overdue.
    SELECT array_agg(c.id), array_agg(c.recipient), array_agg(c.recipient_id),
           array_agg(c.priority), array_agg(c.category)
    INTO v_ids, v_recipients, v_recipient_ids, v_priorities, v_categories
    FROM (
        SELECT n.id, n.recipient, n.recipient_id, n.priority, n.category
        FROM unnest(v_lanes, v_takes) AS lane(priority, take)
        CROSS JOIN LATERAL (
            SELECT id, recipient, recipient_id, priority, category
            FROM nq_jobs
            WHERE status = 'PENDING'
              AND priority = lane.priority
              AND next_attempt_at <= now()
              AND channel = ANY(p_channels)
              AND (expires_at IS NULL OR expires_at > now())
            ORDER BY next_attempt_at, created_at
            LIMIT lane.take
            FOR UPDATE SKIP LOCKED
        ) n
        LIMIT p_limit
    ) c;
    IF v_ids IS NULL THEN
        ids := '{}';
        targeted := false;
        RETURN NEXT;
        RETURN;
    END IF;

    -- Recipient locks: a transaction-scoped advisory lock per distinct recipient, in key order
    -- (two workers with overlapping recipients queue instead of deadlocking). While held, no
    -- other worker counts or takes that recipient's window places; the admission, a later
    -- statement, sees what a worker we waited for committed.
    PERFORM pg_advisory_xact_lock(k.key)
    FROM (SELECT DISTINCT hashtextextended(r, 0) AS key FROM unnest(v_recipients) AS r
          ORDER BY key) k;

    -- Quiet hours: of the candidates whose stored recipient has them, what the worker needs to
    -- tell whether they hold now (services/preferences.py decides, on the worker's clock). A
    -- primary-key lookup each, aggregated in one pass so the arrays line up.
    ids := v_ids;
    targeted := false;
    IF EXISTS (SELECT 1 FROM unnest(v_recipient_ids) AS r WHERE r IS NOT NULL) THEN
        targeted := true;
        SELECT array_agg(c.id), array_agg(c.priority), array_agg(c.category),
               array_agg(r.timezone), array_agg(r.quiet_start), array_agg(r.quiet_end)
        INTO quiet_ids, quiet_priorities, quiet_categories, quiet_timezones, quiet_starts,
             quiet_ends
        FROM unnest(v_ids, v_recipient_ids, v_priorities, v_categories)
             AS c(id, recipient_id, priority, category)
        JOIN nq_recipients r ON r.id = c.recipient_id
        WHERE r.quiet_start IS NOT NULL AND r.quiet_end IS NOT NULL;
    END IF;
    RETURN NEXT;
END $$;
