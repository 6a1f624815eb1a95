-- A claim's first step (in the worker's transaction, or inside nq_claim_v2): lock up to p_limit
-- due notifications, the most urgent first (aged by p_aging_seconds: docs/design.md, "Aging"),
-- a lane's tenants in turn (docs/quotas.md, "Fair share"), and
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
{{_drain_function}}
#variable_conflict use_column
DECLARE
    v_ids uuid[];
    v_recipients text[];
    v_recipient_ids text[];
    v_priorities smallint[];
    v_categories text[];
    v_lanes smallint[];
    v_tenants text[];
    v_takes integer[];
BEGIN
    -- The queues: each lane's tenants with PENDING rows, a loose index scan of the fair-share
    -- index (one probe per (lane, tenant), whatever their backlogs: docs/quotas.md, "Fair share").
    SELECT COALESCE(array_agg(q.priority ORDER BY q.priority, q.tenant), '{}'),
           COALESCE(array_agg(q.tenant ORDER BY q.priority, q.tenant), '{}')
    INTO v_lanes, v_tenants
    FROM (
        WITH RECURSIVE queues AS (
            (SELECT j.priority, j.tenant FROM nq_jobs j
             WHERE j.status = 'PENDING' AND j.priority = ANY(p_priorities)
             ORDER BY j.priority, j.tenant LIMIT 1)
            UNION ALL
            SELECT n.priority, n.tenant
            FROM queues q
            CROSS JOIN LATERAL (
                SELECT j.priority, j.tenant FROM nq_jobs j
                WHERE j.status = 'PENDING' AND j.priority = ANY(p_priorities)
                  AND (j.priority, j.tenant) > (q.priority, q.tenant)
                ORDER BY j.priority, j.tenant LIMIT 1) n
        )
        SELECT priority, tenant FROM queues
    ) q;
    v_takes := array_fill(p_limit, ARRAY[cardinality(v_lanes)]);

    -- How many of each queue the batch takes, when more than one queue could give rows and the
    -- order is not plain priority (aging, or several tenants in a lane): each queue's head (its
    -- p_limit oldest due rows, read without locks) in the claim's order (_claim_fair_order). The
    -- batch's rows are among those heads, so at most p_limit rows per queue are read and sorted,
    -- never the backlog; a lock is then taken only on a row the batch claims. Otherwise every
    -- queue may fill the batch and the outer LIMIT below keeps strict priority.
    IF cardinality(v_lanes) > 1
       AND (p_aging_seconds > 0
            OR cardinality(v_lanes) > (SELECT count(DISTINCT l) FROM unnest(v_lanes) AS l)) THEN
        SELECT COALESCE(array_agg(q.priority ORDER BY q.priority, q.tenant), '{}'),
               COALESCE(array_agg(q.tenant ORDER BY q.priority, q.tenant), '{}'),
               COALESCE(array_agg(q.take ORDER BY q.priority, q.tenant), '{}')
        INTO v_lanes, v_tenants, v_takes
        FROM (
            SELECT h.priority, h.tenant, count(*)::integer AS take
            FROM (SELECT h.priority, h.tenant
                  FROM (SELECT h.*, {{_claim_fair_turn}}
                        FROM (SELECT h.*, {{_claim_lane_rank}} AS rank, {{_claim_tenant_turn}}
                              FROM unnest(v_lanes, v_tenants) AS q(priority, tenant)
                              CROSS JOIN LATERAL (
                                  SELECT j.priority, j.tenant, j.next_attempt_at, j.created_at
                                  FROM nq_jobs j
                                  WHERE j.status = 'PENDING'
                                    AND j.priority = q.priority AND j.tenant = q.tenant
                                    AND j.next_attempt_at <= now()
                                    AND j.channel = ANY(p_channels)
                                    AND (j.expires_at IS NULL OR j.expires_at > now())
                                  ORDER BY j.next_attempt_at, j.created_at
                                  LIMIT p_limit
                              ) h) h) h
                  ORDER BY {{_claim_fair_order}}
                  LIMIT p_limit) h
            GROUP BY h.priority, h.tenant
        ) q;
    END IF;

    -- Candidates: per queue, highest priority first, up to its take of the head of its range of
    -- the fair-share index, FOR UPDATE SKIP LOCKED (another worker's rows are skipped, never
    -- waited for: it takes the rows after them). The LATERAL and the outer LIMIT read a lower
    -- priority only when the higher ones ran out. Expired rows are left to expire_overdue.
    SELECT array_agg(c.id), array_agg(c.recipient), array_agg(c.recipient_id),
           array_agg(c.priority), array_agg(c.category)
    INTO v_ids, v_recipients, v_recipient_ids, v_priorities, v_categories
    FROM (
        SELECT n.id, n.recipient, n.recipient_id, n.priority, n.category
        FROM unnest(v_lanes, v_tenants, v_takes) AS lane(priority, tenant, take)
        CROSS JOIN LATERAL (
            SELECT id, recipient, recipient_id, priority, category
            FROM nq_jobs
            WHERE status = 'PENDING'
              AND priority = lane.priority
              AND tenant = lane.tenant
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
