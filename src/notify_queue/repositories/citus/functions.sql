-- The drain's per-bucket steps as Citus distributed functions delegated by bucket
-- (docs/scaling.md "Citus: the drain as delegated functions"). Not a numbered migration: like
-- citus/layout.sql, `notify-queue migrate` runs it after the layout whenever the engine is Citus
-- (repositories/schema.py); plain PostgreSQL never has these functions. CREATE OR REPLACE and
-- create_distributed_function are idempotent, so a second `migrate` changes nothing.
--
-- Each `nq_*_bucket` function with a `p_bucket` argument is distributed with
-- distribution_arg_name => 'p_bucket', colocate_with => 'nq_jobs' and force_delegation: the
-- coordinator sends `SELECT * FROM nq_x_bucket(<bucket>, ...)` whole to the node that holds the
-- bucket's shards (also inside the caller's transaction), and every statement of the body runs
-- there by local execution on those shards: no intermediate results, no statement planned in
-- parts on the coordinator. The coordinator commits the caller's transaction, one phase when it
-- wrote nothing itself. Rules the bodies follow (Citus 14.0.1, force delegation):
-- - Every statement that reads or writes a distributed table names `bucket = p_bucket` (the
--   counters: `shard = p_bucket`; nq_counters is co-located with nq_jobs, citus/layout.sql):
--   a force-delegated function may touch only the co-located shards of its argument's value
--   ("queries must filter by the distribution argument ...").
-- - No INSERT inside a CTE (Citus plans it through intermediate results) and no INSERT ...
--   SELECT (it carries no distribution value for the force-delegation check): a move reads the
--   locked queue rows, inserts each log row and webhook event by INSERT ... VALUES, then
--   DELETEs, as statements of their own; webhook event ids come from gen_random_uuid() in
--   PL/pgSQL.
-- - Nothing the coordinator owns: the status outbox and the Kubernetes links (coordinator
--   tables), its NOTIFY (a NOTIFY on a worker node reaches no LISTEN on the coordinator), the
--   reference tables' writes (a write on every node) and the providers' tables. The functions
--   return what the caller writes there in the same transaction: the Kubernetes rows' changes
--   (citus_status_outbox_queue) and the push tokens a provider said are gone.
-- - No nested function that itself runs a distributed statement inside a statement (it would
--   run as a query on a shard): nq_finish_bucket is PERFORMed / selected on its own.
-- - Every row a body touches is found by key (the bucket and the batch's ids, its recipients'
--   windows, its digests), so each function runs with `enable_seqscan = off`: a shard's plan
--   that reads a whole table is taken only where no index can serve, never because a shard's
--   statistics say the table is empty (the drain's functions on plain PostgreSQL do the same:
--   functions/nq_claim_lock_v2.sql and nq_claim_v2.sql; docs/performance.md).

-- Functions made before the extension, which Citus never saw. A fresh installation's functions
-- were sent to every node as `migrate` made them (citus.create_object_propagation); one moved onto
-- Citus (docs/scaling.md, "Moving an installation onto Citus") has them on the coordinator alone,
-- and statements the coordinator sends to a worker node call some of them (nq_bucket,
-- nq_stored_hash, the functions below). Each is distributed here: made on every node and recorded
-- in pg_dist_object, so a node added later gets it too. After the layout's transaction: Citus
-- propagates a function over one connection per node, which it refuses after the parallel
-- operations of distributing tables in the same transaction.
DO $objects$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = current_schema()::regnamespace
          AND (starts_with(p.proname, 'nq_') OR starts_with(p.proname, 'notify_queue_'))
          AND NOT EXISTS (SELECT FROM pg_dist_object o
                          WHERE o.classid = 'pg_proc'::regclass AND o.objid = p.oid)
        ORDER BY p.oid
    LOOP
        PERFORM create_distributed_function(f);
    END LOOP;
END
$objects$;

-- The move of finished rows from the queue into the log within one bucket (nq_finish_held's, for
-- a delegated caller): each row locked and read with its final values, its log row and its
-- webhook event inserted, then the DELETE, then the counters (shard = the bucket). The
-- Kubernetes rows' changes are returned for the caller's outbox (no outbox here, see above).
-- Arrays as nq_finish's: a NULL array keeps the row's own value. One INSERT ... VALUES per row:
-- an INSERT ... SELECT, even one Citus pushes down to the one shard, carries no distribution
-- value for the force-delegation check and is refused in a delegated function, and so is one
-- INSERT of many rows (VALUES (...), (...), every bucket the same literal). The loop reads the
-- row's columns as columns of its record (`j.*`), not as one composite (`j AS job`): Citus plans
-- each INSERT with its values, and each `(r.job).x` handed it the whole row again, 0.55 against
-- 0.16 ms per INSERT on a worker node (a completion of 25 rows 22.7 -> 7.1-12.9 ms).
CREATE OR REPLACE FUNCTION nq_finish_bucket(
    p_bucket smallint, p_ids uuid[], p_statuses text[], p_last_errors text[],
    p_attempt_counts integer[], p_provider_message_ids text[], p_providers text[],
    p_delivery_attempts jsonb[], p_default_webhook_url text
) RETURNS TABLE (id uuid, status text, old_status text, source text, channel text,
                 recipient text, recipient_id text)
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    v_ids uuid[] := '{}';
    v_old text[] := '{}';
    v_new text[] := '{}';
    v_sources text[] := '{}';
    v_channels text[] := '{}';
    v_recipients text[] := '{}';
    v_recipient_ids text[] := '{}';
    v_policies nq_policies[];
    v_event uuid;
    r record;
    c record;
BEGIN
    IF COALESCE(cardinality(p_ids), 0) = 0 THEN
        RETURN;
    END IF;
    -- The policies (a reference table: read alone, a statement of a force-delegated function
    -- names only tables of the bucket's co-location group), for the webhook URL.
    v_policies := ARRAY(SELECT p FROM nq_policies p);
    FOR r IN
        SELECT j.*, {{_final_values}},
               COALESCE(j.webhook_url, p.webhook_url, p_default_webhook_url) AS hook_url,
               p.name AS hook_policy
        FROM nq_jobs j
        JOIN unnest(p_ids, p_statuses, p_last_errors, p_attempt_counts, p_provider_message_ids,
                    p_providers, p_delivery_attempts)
             AS g(id, status, last_error, attempt_count, provider_message_id, provider,
                  delivery_attempts) ON g.id = j.id
        LEFT JOIN unnest(v_policies) p ON p.name = j.policy
        WHERE j.bucket = p_bucket AND j.id = ANY(p_ids)
        ORDER BY j.id
        FOR UPDATE OF j
    LOOP
        INSERT INTO nq_delivery_log ({{_moved_columns}})
        VALUES (
            r.id, r.idempotency_key, r.request_hash, r.channel, r.recipient, r.subject, r.body,
            r.priority, r.final_status, r.send_at, r.next_attempt_at, r.expires_at,
            r.final_attempt_count, r.max_attempts, r.final_last_error,
            CASE WHEN r.final_status = 'SENT' THEN COALESCE(r.sent_at, now()) ELSE r.sent_at END,
            r.final_provider_message_id, NULL, NULL, r.retries, r.source, r.policy, r.webhook_url,
            r.metadata, r.created_at, now(), COALESCE(r.finished_at, now()), r.recipient_id,
            r.category, r.template_name, r.template_version, r.final_provider,
            r.final_delivery_attempts, p_bucket, r.digest_id, r.escalation_id, r.traceparent,
            r.tenant);
        IF r.final_status IN ('SENT', 'FAILED', 'DEAD_LETTERED', 'EXPIRED', 'SUPPRESSED')
           AND r.hook_url IS NOT NULL THEN
            v_event := gen_random_uuid();
            INSERT INTO nq_webhook_events (id, notification_id, url, policy, payload, bucket)
            VALUES (v_event, r.id, r.hook_url, r.hook_policy,
                    nq_webhook_payload(v_event, r.id, r.final_status, r.final_attempt_count,
                                       r.final_provider),
                    p_bucket);
        END IF;
        v_ids := v_ids || r.id;
        v_old := v_old || r.old_status;
        v_new := v_new || r.final_status;
        v_sources := v_sources || r.source;
        v_channels := v_channels || r.channel;
        v_recipients := v_recipients || r.recipient;
        v_recipient_ids := v_recipient_ids || r.recipient_id;
    END LOOP;
    IF cardinality(v_ids) = 0 THEN
        RETURN;
    END IF;
    DELETE FROM nq_jobs j WHERE j.bucket = p_bucket AND j.id = ANY(v_ids);
    -- Counters (nq_count's rule: +1 into a state, -1 out of it, unfinished states uncounted), in
    -- name order, on the bucket's counter rows.
    FOR c IN
        SELECT x.s, sum(x.d) AS d
        FROM (SELECT t.s, 1 AS d FROM unnest(v_new) AS t(s)
              UNION ALL
              SELECT f.s, -1 FROM unnest(v_old) AS f(s)) x
        WHERE x.s <> ALL('{PENDING,PROCESSING}')
        GROUP BY x.s HAVING sum(x.d) <> 0 ORDER BY 1
    LOOP
        INSERT INTO nq_counters AS k (name, shard, n)
        VALUES ('notifications:' || c.s, p_bucket, c.d)
        ON CONFLICT (name, shard) DO UPDATE SET n = k.n + excluded.n;
    END LOOP;
    RETURN QUERY
    SELECT o.i, o.s, o.f, o.source, o.channel, o.recipient, o.recipient_id
    FROM unnest(v_ids, v_new, v_old, v_sources, v_channels, v_recipients, v_recipient_ids)
         AS o(i, s, f, source, channel, recipient, recipient_id);
END $$;

-- complete_deliveries (delivery.sql) for the results of one bucket, delegated to its node: the
-- results matched to their rows (locked, by claim token), the rows that end moved by
-- nq_finish_bucket (with a closed digest's parked items), the retried ones back to PENDING and
-- the window places of attempts that sent nothing given back. Returns the ids accepted, the
-- Kubernetes rows' changes (the caller's outbox) and the push tokens a provider said are gone
-- (the caller's update of nq_recipients, a reference table).
CREATE OR REPLACE FUNCTION nq_complete_bucket(
    p_bucket smallint, p_ids uuid[], p_claim_tokens uuid[], p_statuses text[],
    p_retry_in_seconds float8[], p_last_errors text[], p_provider_message_ids text[],
    p_providers text[], p_attempts jsonb, p_give_back boolean[],
    p_next_attempt_ats timestamptz[], p_addresses_gone boolean[], p_bound_providers text[],
    p_waiting_reasons text[], p_waiting_details text[], p_default_webhook_url text,
    OUT accepted_ids uuid[], OUT kube_ids uuid[], OUT kube_old_statuses text[],
    OUT kube_new_statuses text[], OUT gone_recipient_ids text[], OUT gone_tokens text[])
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    e_ids uuid[]; e_statuses text[]; e_errors text[]; e_counts integer[]; e_pmids text[];
    e_providers text[]; e_attempts jsonb[];
    r_ids uuid[]; r_next timestamptz[]; r_errors text[]; r_pmids text[]; r_providers text[];
    r_attempts jsonb[]; r_counts integer[]; r_reasons text[]; r_details text[];
    v_accepted uuid[]; v_gone uuid[];
    b_ids uuid[] := '{}'; b_recipients text[] := '{}';
    f record;
    t record;
BEGIN
    kube_ids := '{}'; kube_old_statuses := '{}'; kube_new_statuses := '{}';
    gone_recipient_ids := '{}'; gone_tokens := '{}';
    WITH results AS (
        SELECT r.*, a.attempts FROM unnest(
            p_ids, p_claim_tokens, p_statuses, p_retry_in_seconds, p_last_errors,
            p_provider_message_ids, p_providers, p_give_back, p_next_attempt_ats,
            p_addresses_gone, p_bound_providers, p_waiting_reasons, p_waiting_details
        ) WITH ORDINALITY AS r(id, claim_token, status, retry_in_seconds, last_error,
                               provider_message_id, provider, give_back, next_attempt_at,
                               address_gone, bound_provider, waiting_reason, waiting_detail,
                               position)
        JOIN jsonb_array_elements(p_attempts) WITH ORDINALITY AS a(attempts, position)
          USING (position)
    ), held AS (
        -- Locked, so what is read here is what the move and the retry write. The status is
        -- checked in `accepted`: here it would match the lease index's predicate, which a
        -- generic plan may prefer to the primary key (nq_complete_deliveries).
        SELECT n.id, n.status, n.claim_token, n.bucket, n.recipient, n.attempt_count,
               n.provider_message_id, n.delivery_attempts, n.next_attempt_at, n.digest_id
        FROM nq_jobs n
        WHERE n.bucket = p_bucket AND n.id = ANY(p_ids)
        ORDER BY n.id
        FOR UPDATE
    ), accepted AS (
        SELECT r.*, h.digest_id,
               h.attempt_count - CASE WHEN r.give_back THEN 1 ELSE 0 END AS final_attempt_count,
               COALESCE(r.provider_message_id, h.provider_message_id) AS final_provider_message_id,
               CASE WHEN r.status = 'SENT' THEN r.provider ELSE r.bound_provider END
                   AS final_provider,
               nq_attempts_append(h.delivery_attempts, r.attempts) AS final_delivery_attempts,
               COALESCE(r.next_attempt_at, now() + make_interval(secs => r.retry_in_seconds),
                        h.next_attempt_at) AS final_next_attempt_at
        FROM results r
        JOIN held h ON h.id = r.id AND h.claim_token = r.claim_token AND h.status = 'PROCESSING'
    ), digest_items AS (
        -- [digests] A closed digest's parked items end with their carrier (docs/digests.md);
        -- nq_finish_bucket locks them.
        SELECT n.id, a.status, a.last_error, a.final_attempt_count, a.final_provider_message_id,
               a.final_provider, a.final_delivery_attempts
        FROM accepted a JOIN nq_jobs n ON n.digest_id = a.digest_id
        WHERE n.bucket = p_bucket AND a.status <> 'PENDING' AND a.digest_id IS NOT NULL
          AND n.id <> a.id AND n.status = 'PENDING'
    ), ending AS (
        SELECT id, status, last_error, final_attempt_count, final_provider_message_id,
               final_provider, final_delivery_attempts
        FROM accepted WHERE status <> 'PENDING'
        UNION ALL SELECT * FROM digest_items
    )
    SELECT ARRAY(SELECT id FROM ending ORDER BY id),
           ARRAY(SELECT status FROM ending ORDER BY id),
           ARRAY(SELECT last_error FROM ending ORDER BY id),
           ARRAY(SELECT final_attempt_count FROM ending ORDER BY id),
           ARRAY(SELECT final_provider_message_id FROM ending ORDER BY id),
           ARRAY(SELECT final_provider FROM ending ORDER BY id),
           ARRAY(SELECT final_delivery_attempts FROM ending ORDER BY id),
           ARRAY(SELECT id FROM accepted WHERE status = 'PENDING' ORDER BY id),
           ARRAY(SELECT final_next_attempt_at FROM accepted WHERE status = 'PENDING' ORDER BY id),
           ARRAY(SELECT last_error FROM accepted WHERE status = 'PENDING' ORDER BY id),
           ARRAY(SELECT final_provider_message_id FROM accepted WHERE status = 'PENDING'
                 ORDER BY id),
           ARRAY(SELECT final_provider FROM accepted WHERE status = 'PENDING' ORDER BY id),
           ARRAY(SELECT final_delivery_attempts FROM accepted WHERE status = 'PENDING'
                 ORDER BY id),
           ARRAY(SELECT final_attempt_count FROM accepted WHERE status = 'PENDING' ORDER BY id),
           ARRAY(SELECT waiting_reason FROM accepted WHERE status = 'PENDING' ORDER BY id),
           ARRAY(SELECT waiting_detail FROM accepted WHERE status = 'PENDING' ORDER BY id),
           ARRAY(SELECT id FROM accepted),
           ARRAY(SELECT id FROM accepted WHERE address_gone)
    INTO e_ids, e_statuses, e_errors, e_counts, e_pmids, e_providers, e_attempts,
         r_ids, r_next, r_errors, r_pmids, r_providers, r_attempts, r_counts, r_reasons,
         r_details, v_accepted, v_gone;
    accepted_ids := v_accepted;

    FOR f IN SELECT * FROM nq_finish_bucket(p_bucket, e_ids, e_statuses, e_errors, e_counts,
                                            e_pmids, e_providers, e_attempts,
                                            p_default_webhook_url) LOOP
        IF f.source = 'kubernetes' THEN
            kube_ids := kube_ids || f.id;
            kube_old_statuses := kube_old_statuses || f.old_status;
            kube_new_statuses := kube_new_statuses || f.status;
        END IF;
        IF f.status <> 'SENT' THEN
            -- Places in the window of attempts that sent nothing.
            b_ids := b_ids || f.id;
            b_recipients := b_recipients || f.recipient;
            IF f.channel = 'push' AND f.recipient_id IS NOT NULL AND f.id = ANY(v_gone) THEN
                gone_recipient_ids := gone_recipient_ids || f.recipient_id;
                gone_tokens := gone_tokens || f.recipient;
            END IF;
        END IF;
    END LOOP;

    IF cardinality(r_ids) = 0 AND cardinality(b_ids) = 0 THEN
        RETURN;
    END IF;
    FOR t IN
        WITH retried AS (
            UPDATE nq_jobs n
            SET status = 'PENDING',
                next_attempt_at = r.next_attempt_at,
                last_error = r.last_error,
                provider_message_id = r.provider_message_id,
                provider = r.provider,
                delivery_attempts = r.delivery_attempts,
                attempt_count = r.attempt_count,
                claim_token = NULL,
                lease_expires_at = NULL,
                waiting_reason = r.waiting_reason,
                waiting_until = r.next_attempt_at,
                -- The worker words what only it knows (CircuitOpen, ProviderRateLimit); the
                -- others are worded here from the result (searched CASE: the header of
                -- citus/statements.sql).
                waiting_detail = COALESCE(r.waiting_detail, CASE
                    WHEN r.waiting_reason = 'Backoff'
                        THEN 'retry after attempt ' || r.attempt_count::text || ': '
                             || left(r.last_error, 200)
                    WHEN r.waiting_reason = 'QuietHours' THEN 'the recipient''s quiet hours'
                    ELSE left(r.last_error, 200) END),
                updated_at = now()
            FROM unnest(r_ids, r_next, r_errors, r_pmids, r_providers, r_attempts, r_counts,
                        r_reasons, r_details)
                 AS r(id, next_attempt_at, last_error, provider_message_id, provider,
                      delivery_attempts, attempt_count, waiting_reason, waiting_detail)
            WHERE n.bucket = p_bucket AND n.id = ANY(r_ids) AND n.id = r.id
            RETURNING n.id, n.source, n.recipient
        ), given_back AS (
            SELECT g.recipient, array_agg(g.id) AS ids
            FROM (SELECT b.id, b.recipient FROM unnest(b_ids, b_recipients) AS b(id, recipient)
                  UNION ALL SELECT id, recipient FROM retried) g
            GROUP BY g.recipient
        ), released AS (
            UPDATE nq_rate_windows w
            {{_window_give_back}}
            FROM given_back g
            WHERE w.bucket = p_bucket AND w.recipient = g.recipient
        )
        SELECT id, source FROM retried
    LOOP
        {{_kube_requeued}}
    END LOOP;
END $$;

-- The previous release's lock step (strict priority, the candidates in (priority, due) order),
-- called by its workers during a roll-out; nq_claim_lock_bucket_v2 replaces it and a contract
-- migration drops it (docs/upgrading.md).
CREATE OR REPLACE FUNCTION nq_claim_lock_bucket(
    p_bucket smallint, p_priorities smallint[], p_channels text[], p_limit integer,
    OUT ids uuid[], OUT quiet_ids uuid[], OUT quiet_priorities smallint[],
    OUT quiet_categories text[], OUT quiet_timezones text[], OUT quiet_starts time[],
    OUT quiet_ends time[], OUT digest_ids uuid[])
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $$
DECLARE
    v_ids uuid[];
    v_recipient_ids text[];
    v_stored_ids uuid[];
    v_priorities smallint[];
    v_categories text[];
BEGIN
    WITH candidates AS (
        SELECT j.id, j.recipient, j.recipient_id, j.priority, j.category
        FROM nq_jobs j
        WHERE j.bucket = p_bucket AND j.status = 'PENDING'
          AND j.priority = ANY(p_priorities)
          AND j.next_attempt_at <= now()
          AND j.channel = ANY(p_channels)
          AND (j.expires_at IS NULL OR j.expires_at > now())
        ORDER BY j.priority, j.next_attempt_at, j.created_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), recipient_locks AS (
        SELECT pg_advisory_xact_lock(k.key)
        FROM (SELECT DISTINCT hashtextextended(c.recipient, 0) AS key FROM candidates c
              ORDER BY key) k
    )
    SELECT ARRAY(SELECT c.id FROM candidates c),
           ARRAY(SELECT c.recipient_id FROM candidates c WHERE c.recipient_id IS NOT NULL),
           ARRAY(SELECT c.id FROM candidates c WHERE c.recipient_id IS NOT NULL),
           ARRAY(SELECT c.priority FROM candidates c WHERE c.recipient_id IS NOT NULL),
           ARRAY(SELECT c.category FROM candidates c WHERE c.recipient_id IS NOT NULL)
    INTO v_ids, v_recipient_ids, v_stored_ids, v_priorities, v_categories
    WHERE (SELECT count(*) FROM recipient_locks) >= 0;
    -- The stored recipients' quiet hours, in a statement of its own: Citus refuses a reference
    -- table beside a distributed one in a force-delegated function (the statement's tables must
    -- all be of the bucket's co-location group).
    IF cardinality(v_recipient_ids) > 0 THEN
        SELECT array_agg(c.id), array_agg(c.priority), array_agg(c.category),
               array_agg(r.timezone), array_agg(r.quiet_start), array_agg(r.quiet_end)
        INTO quiet_ids, quiet_priorities, quiet_categories, quiet_timezones, quiet_starts,
             quiet_ends
        FROM unnest(v_stored_ids, v_recipient_ids, v_priorities, v_categories)
             AS c(id, recipient_id, priority, category)
        JOIN nq_recipients r ON r.id = c.recipient_id
        WHERE r.quiet_start IS NOT NULL AND r.quiet_end IS NOT NULL;
    END IF;
    ids := v_ids;
    digest_ids := '{}';
    IF cardinality(v_ids) > 0 THEN
        digest_ids := ARRAY(
            SELECT d.id FROM nq_digests d
            WHERE d.bucket = p_bucket
              AND d.id IN (SELECT j.digest_id FROM nq_jobs j
                           WHERE j.bucket = p_bucket AND j.id = ANY(v_ids)
                             AND j.digest_id IS NOT NULL)
            FOR UPDATE SKIP LOCKED);
    END IF;
END $$;

-- A claim's first step within one bucket, delegated to its node (claim_lock_candidates on plain
-- PostgreSQL): up to p_limit due rows of the bucket, the most urgent by aged priority
-- (p_aging_seconds; ranks up to p_max_rank, the look's P* or those before it), a lane's tenants
-- in turn (docs/quotas.md, "Fair share"), locked SKIP
-- LOCKED; their recipients' advisory locks (taken on the bucket's node, where every claim of
-- that recipient runs), the quiet-hours facts of their stored recipients for the worker's
-- decision, and the candidates' digests locked SKIP LOCKED (as the plain claim's digest_locked:
-- a create joining a digest or a cancel leaving it holds it a moment, its item is looked at again
-- soon), which nq_claim_admit_bucket reads.
CREATE OR REPLACE FUNCTION nq_claim_lock_bucket_v2(
    p_bucket smallint, p_priorities smallint[], p_channels text[], p_limit integer,
    p_aging_seconds float8, p_max_rank smallint,
    OUT ids uuid[], OUT quiet_ids uuid[], OUT quiet_priorities smallint[],
    OUT quiet_categories text[], OUT quiet_timezones text[], OUT quiet_starts time[],
    OUT quiet_ends time[], OUT digest_ids uuid[])
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $$
DECLARE
    v_ids uuid[] := '{}';
    v_recipients text[] := '{}';
    v_recipient_ids text[] := '{}';
    v_stored_ids uuid[] := '{}';
    v_priorities smallint[] := '{}';
    v_categories text[] := '{}';
    v_lanes smallint[];
    v_tenants text[];
    v_takes integer[];
    v_take integer;
    i integer;
BEGIN
    -- The bucket's queues (its lanes' tenants with PENDING rows, a loose index scan) and each
    -- one's take, as nq_claim_lock_v2; ranks up to p_max_rank only.
    SELECT COALESCE(array_agg(q.priority ORDER BY q.priority, q.tenant), '{}'),
           COALESCE(array_agg(q.tenant ORDER BY q.priority, q.tenant), '{}')
    INTO v_lanes, v_tenants
    FROM (
        WITH RECURSIVE queues AS (
            (SELECT j.priority, j.tenant FROM nq_jobs j
             WHERE j.bucket = p_bucket AND j.status = 'PENDING'
               AND j.priority = ANY(p_priorities)
             ORDER BY j.priority, j.tenant LIMIT 1)
            UNION ALL
            SELECT n.priority, n.tenant
            FROM queues q
            CROSS JOIN LATERAL (
                SELECT j.priority, j.tenant FROM nq_jobs j
                WHERE j.bucket = p_bucket AND j.status = 'PENDING'
                  AND j.priority = ANY(p_priorities)
                  AND (j.priority, j.tenant) > (q.priority, q.tenant)
                ORDER BY j.priority, j.tenant LIMIT 1) n
        )
        SELECT priority, tenant FROM queues
    ) q;
    v_takes := ARRAY(SELECT CASE WHEN l <= p_max_rank THEN p_limit ELSE 0 END
                     FROM unnest(v_lanes) AS l);
    -- With aging, always: the look's rank bounds what this bucket may take.
    IF p_aging_seconds > 0
       OR cardinality(v_lanes) > (SELECT count(DISTINCT l) FROM unnest(v_lanes) AS l) THEN
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
                                  WHERE j.bucket = p_bucket AND j.status = 'PENDING'
                                    AND j.priority = q.priority AND j.tenant = q.tenant
                                    AND j.next_attempt_at <= now()
                                    AND j.channel = ANY(p_channels)
                                    AND (j.expires_at IS NULL OR j.expires_at > now())
                                  ORDER BY j.next_attempt_at, j.created_at
                                  LIMIT p_limit
                              ) h) h
                        WHERE h.rank <= p_max_rank) h
                  ORDER BY {{_claim_fair_order}}
                  LIMIT p_limit) h
            GROUP BY h.priority, h.tenant
        ) q;
    END IF;
    -- Each queue's take of its head, FOR UPDATE SKIP LOCKED, until the batch is full: one router
    -- statement per queue that has some (Citus plans a row lock only at a statement's top level).
    FOR i IN 1 .. COALESCE(cardinality(v_lanes), 0) LOOP
        v_take := LEAST(v_takes[i], p_limit - cardinality(v_ids));
        CONTINUE WHEN v_take <= 0;
        WITH candidates AS (
            SELECT j.id, j.recipient, j.recipient_id, j.priority, j.category
            FROM nq_jobs j
            WHERE j.bucket = p_bucket AND j.status = 'PENDING'
              AND j.priority = v_lanes[i] AND j.tenant = v_tenants[i]
              AND j.next_attempt_at <= now()
              AND j.channel = ANY(p_channels)
              AND (j.expires_at IS NULL OR j.expires_at > now())
            ORDER BY j.next_attempt_at, j.created_at
            LIMIT v_take
            FOR UPDATE SKIP LOCKED
        )
        SELECT v_ids || ARRAY(SELECT c.id FROM candidates c),
               v_recipients || ARRAY(SELECT c.recipient FROM candidates c),
               v_recipient_ids || ARRAY(SELECT c.recipient_id FROM candidates c
                                        WHERE c.recipient_id IS NOT NULL),
               v_stored_ids || ARRAY(SELECT c.id FROM candidates c
                                     WHERE c.recipient_id IS NOT NULL),
               v_priorities || ARRAY(SELECT c.priority FROM candidates c
                                     WHERE c.recipient_id IS NOT NULL),
               v_categories || ARRAY(SELECT c.category FROM candidates c
                                     WHERE c.recipient_id IS NOT NULL)
        INTO v_ids, v_recipients, v_recipient_ids, v_stored_ids, v_priorities, v_categories;
    END LOOP;
    -- Recipient locks, in key order (as nq_claim_lock_v2).
    PERFORM pg_advisory_xact_lock(k.key)
    FROM (SELECT DISTINCT hashtextextended(r, 0) AS key FROM unnest(v_recipients) AS r
          ORDER BY key) k;
    -- The stored recipients' quiet hours, in a statement of its own: Citus refuses a reference
    -- table beside a distributed one in a force-delegated function (the statement's tables must
    -- all be of the bucket's co-location group).
    IF cardinality(v_recipient_ids) > 0 THEN
        SELECT array_agg(c.id), array_agg(c.priority), array_agg(c.category),
               array_agg(r.timezone), array_agg(r.quiet_start), array_agg(r.quiet_end)
        INTO quiet_ids, quiet_priorities, quiet_categories, quiet_timezones, quiet_starts,
             quiet_ends
        FROM unnest(v_stored_ids, v_recipient_ids, v_priorities, v_categories)
             AS c(id, recipient_id, priority, category)
        JOIN nq_recipients r ON r.id = c.recipient_id
        WHERE r.quiet_start IS NOT NULL AND r.quiet_end IS NOT NULL;
    END IF;
    ids := v_ids;
    digest_ids := '{}';
    IF cardinality(v_ids) > 0 THEN
        digest_ids := ARRAY(
            SELECT d.id FROM nq_digests d
            WHERE d.bucket = p_bucket
              AND d.id IN (SELECT j.digest_id FROM nq_jobs j
                           WHERE j.bucket = p_bucket AND j.id = ANY(v_ids)
                             AND j.digest_id IS NOT NULL)
            FOR UPDATE SKIP LOCKED);
    END IF;
END $$;

-- A claim's second step within one bucket, delegated to its node (claim_admit_candidates on plain
-- PostgreSQL, whose comment says what it decides): of the rows nq_claim_lock_bucket locked,
-- admit those within their recipient's window, defer the others, hold those of a policy that is
-- not Ready, close or park digests. Escalation steps whose escalation is acknowledged are moved
-- first (CANCELLED, nq_finish_bucket) and left out of the statement. The Kubernetes rows'
-- changes come back on every row (kube_*) for the caller's outbox.
CREATE OR REPLACE FUNCTION nq_claim_admit_bucket(
    p_bucket smallint, p_ids uuid[], p_claim_token uuid, p_rate_limit integer,
    p_rate_window_seconds float8, p_lease_seconds float8, p_backoff_base_seconds float8,
    p_backoff_max_seconds float8, p_chain_channels text[], p_chain_heads text[],
    p_known_providers text[], p_quiet_ids uuid[], p_digest_ids uuid[], p_webhook_url text
) RETURNS TABLE (
    deferred_channels text[], escalation_steps_stopped integer, kube_ids uuid[],
    kube_old_statuses text[], kube_new_statuses text[],
    {{_claimed_columns}})
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $fn$
#variable_conflict use_column
DECLARE
    v_acknowledged uuid[];
    v_recipient_ids text[];
    v_new_windows text[];
    v_recipient text;
    v_policies nq_policies[];
    v_recipients nq_recipients[];
    v_stopped integer := 0;
    v_kube_ids uuid[] := '{}';
    v_kube_new text[] := '{}';
    fin record;
BEGIN
    -- ESCALATION GUARD (docs/escalation.md): read after step 1's lock, as the plain statement
    -- reads it; a step whose escalation is acknowledged is not handed out but cancelled.
    SELECT COALESCE(array_agg(n.id) FILTER (
               WHERE n.escalation_id IS NOT NULL
                 AND EXISTS (SELECT 1 FROM nq_escalations e
                             WHERE e.bucket = p_bucket AND e.id = n.escalation_id
                               AND e.acknowledged_at IS NOT NULL)), '{}'),
           COALESCE(array_agg(DISTINCT n.recipient_id) FILTER (WHERE n.recipient_id IS NOT NULL),
                    '{}'),
           ARRAY(SELECT DISTINCT x.recipient
                 FROM unnest(array_agg(n.recipient)) AS x(recipient)
                 WHERE NOT EXISTS (SELECT 1 FROM nq_rate_windows w
                                   WHERE w.bucket = p_bucket AND w.recipient = x.recipient)
                 ORDER BY x.recipient)
    INTO v_acknowledged, v_recipient_ids, v_new_windows
    FROM nq_jobs n
    WHERE n.bucket = p_bucket AND n.id = ANY(p_ids);
    -- An empty window for each recipient that has none yet (the statement below updates windows
    -- in place), in recipient order as every writer of windows; an unused one is pruned later.
    FOREACH v_recipient IN ARRAY v_new_windows LOOP
        INSERT INTO nq_rate_windows (bucket, recipient, ids, taken, last_taken_at)
        VALUES (p_bucket, v_recipient, '{}', '{}', now())
        ON CONFLICT (bucket, recipient) DO NOTHING;
    END LOOP;
    -- The reference tables the statement joins, read first (a statement of a force-delegated
    -- function may name only tables of the bucket's co-location group beside the bucket): the
    -- policies (a handful of rows) and the batch's stored recipients, each as an array of rows
    -- that the statement unnests where the plain one joins the table.
    v_policies := ARRAY(SELECT p FROM nq_policies p);
    v_recipients := ARRAY(SELECT r FROM nq_recipients r WHERE r.id = ANY(v_recipient_ids));
    IF cardinality(v_acknowledged) > 0 THEN
        FOR fin IN SELECT * FROM nq_finish_bucket(
                p_bucket, v_acknowledged,
                array_fill('CANCELLED'::text, ARRAY[cardinality(v_acknowledged)]),
                array_fill('acknowledged'::text, ARRAY[cardinality(v_acknowledged)]),
                NULL, NULL, NULL, NULL, p_webhook_url) LOOP
            v_stopped := v_stopped + 1;
            IF fin.source = 'kubernetes' THEN
                v_kube_ids := v_kube_ids || fin.id;
                v_kube_new := v_kube_new || fin.status;
            END IF;
        END LOOP;
        p_ids := ARRAY(SELECT x FROM unnest(p_ids) AS x WHERE x <> ALL(v_acknowledged));
    END IF;
    RETURN QUERY
    WITH batch_all AS (
        SELECT n.id, n.bucket, n.recipient, n.priority, n.next_attempt_at, n.created_at, n.source,
               n.attempt_count, n.digest_id,
               {{_claim_limits}}
               -- ESCALATION GUARD (docs/escalation.md): a step whose escalation is acknowledged is
               -- not handed out but cancelled (above). Read from this statement's snapshot, never
               -- locked: an acknowledgement committed before it started is seen; one not yet
               -- committed waits for these rows (it locks the escalation, then its steps), so the
               -- step goes out only if it was due before that acknowledgement commits.
               CASE WHEN n.escalation_id IS NULL THEN false
                    ELSE EXISTS (SELECT 1 FROM nq_escalations e
                                 WHERE e.bucket = p_bucket AND e.id = n.escalation_id
                                   AND e.acknowledged_at IS NOT NULL) END AS acknowledged,
               n.provider AS sticky_provider,
               {{_claim_chain_head}}
        FROM nq_jobs n
        LEFT JOIN unnest(v_policies) p ON p.name = n.policy
        WHERE n.bucket = p_bucket AND n.id = ANY(p_ids)
    ), digest_locked AS (
        -- [digests] docs/digests.md. The digests of the batch's items, through their primary key (a
        -- batch without digest items reads nothing), SKIP LOCKED: a create joining a digest or a
        -- cancel leaving it holds it for a moment, and its item is looked at again in a second.
        -- Never a wait here, so this side needs no lock order between items and digests. An item
        -- whose carrier has left the queue without sending it (its lease lost on the last attempt)
        -- takes over: `orphaned`.
        SELECT d.bucket, d.id, d.carrier_id,
               NOT EXISTS (SELECT 1 FROM nq_jobs j
                           WHERE j.bucket = p_bucket AND j.bucket = d.bucket AND j.id = d.carrier_id) AS orphaned
        FROM nq_digests d
        -- Locked by nq_claim_lock_bucket in this transaction (a FOR UPDATE CTE is what the
        -- plain claim uses; Citus returns its rows to later CTEs in the wrong format).
        WHERE d.bucket = p_bucket AND d.id = ANY(p_digest_ids)
    ), digest_roles AS (
    {{_claim_digest_roles}}
    ), windows AS (
        -- Per recipient and window length (a policy may set its own): the entries in the window.
        SELECT r.bucket, r.recipient, r.win, COALESCE(w.ids, '{}') AS ids,
               COALESCE(w.taken, '{}') AS taken, COALESCE(w.channels, '{}') AS channels,
               {{_claim_window_used}}
        FROM (SELECT DISTINCT bucket, recipient, win FROM batch) r
        LEFT JOIN LATERAL (
            SELECT ids, taken, channels FROM nq_rate_windows w
            WHERE w.bucket = p_bucket AND w.recipient = r.recipient
            FOR UPDATE
        ) w ON true
    ), decided AS (
        SELECT b.id, b.bucket, b.recipient, b.win, w.used, w.taken, b.rate_limit, b.held, b.quiet,
               b.acknowledged, b.source, b.attempt_count, b.sticky_provider, b.chain_head,
               {{_claim_holds_slot}},
               b.priority, b.next_attempt_at, b.created_at,
               b.channel, b.channel_limit, b.channel_win, w.channels,
               {{_claim_channel_used}}
        FROM batch b JOIN windows w USING (bucket, recipient, win)
    ), channel_ranked AS (
        -- From `decided` alone, never joined back to `batch` on id (as nq_claim).
        SELECT d.*, {{_claim_channel_rank}}
        FROM decided d
    ), ranked AS (
        SELECT d.*, {{_claim_rank}}
        FROM channel_ranked d
    ), admitted AS (
        UPDATE nq_jobs n
        {{_claim_admitted}}
        FROM ranked r
        -- These rows are locked by step 1 of this transaction, so they are still PENDING. Found
        -- through the primary key, then matched to their decision (as `deferred` below).
        WHERE n.bucket = p_bucket AND n.id = ANY(ARRAY(SELECT r.id FROM ranked r
                                                       WHERE {{_claim_admits}}))
          AND n.id = r.id
        RETURNING n.id, n.bucket, n.channel, n.recipient, n.subject, n.body, n.metadata,
                  n.attempt_count, n.max_attempts, n.priority, n.policy, n.next_attempt_at,
                  n.created_at, n.category, n.expires_at, n.recipient_id, n.source,
                  n.provider AS bound_provider, r.sticky_provider, r.quiet, n.send_at,
                  n.traceparent, n.digest_id
    ), waiting AS (
        {{_claim_waiting}}
    ), held_back AS (
        UPDATE nq_jobs n
        {{_claim_policy_not_ready}}
        WHERE n.bucket = p_bucket
          AND n.id = ANY(ARRAY(SELECT id FROM ranked WHERE held AND NOT acknowledged))
        RETURNING n.id, n.source
    ), deferred AS (
        UPDATE nq_jobs n
        {{_claim_rate_limited}}
        FROM waiting w
        WHERE n.bucket = p_bucket AND n.id = ANY(ARRAY(SELECT id FROM waiting)) AND n.id = w.id
        RETURNING n.id, n.channel, n.source
    ), windowed AS (
        -- Admitted rows that send take their place (a row holding its place renews it); entries no
        -- window in use counts any more are dropped on the way. An UPDATE, not the plain claim's
        -- upsert: Citus plans an INSERT inside a CTE in parts, which a delegated function cannot
        -- run; the batch's recipients without a window got an empty one first (above).
        UPDATE nq_rate_windows w
        SET ids = m.ids, taken = m.taken, channels = m.channels, last_taken_at = now()
        FROM (SELECT bucket, recipient, array_agg(id) AS ids, array_agg(channel) AS channels
              FROM admitted WHERE NOT quiet
              GROUP BY bucket, recipient) a
        CROSS JOIN LATERAL (
            SELECT array_agg(e.id ORDER BY e.t, e.id) AS ids, array_agg(e.t ORDER BY e.t, e.id) AS taken,
                   array_agg(e.c ORDER BY e.t, e.id) AS channels
            FROM (SELECT o.id, o.t, o.c
                  FROM (SELECT v.ids, v.taken, v.channels FROM windows v
                        WHERE v.bucket = a.bucket AND v.recipient = a.recipient LIMIT 1) v,
                       unnest(v.ids, v.taken, v.channels) AS o(id, t, c)
                  WHERE o.t > now() - make_interval(secs => (
                          SELECT GREATEST(p_rate_window_seconds,
                                          COALESCE(max({{_policy_longest_window}}), 0))
                          FROM unnest(v_policies) p))
                    AND o.id <> ALL(a.ids)
                  UNION ALL
                  SELECT x.id, now(), x.c FROM unnest(a.ids, a.channels) AS x(id, c)) e) m
        WHERE w.bucket = p_bucket AND w.recipient = a.recipient
    ), digest_closed AS (
        -- [digests] A claimed carrier closes its digest: a create from now on opens a new one, and
        -- what the carrier sends is every item that joined before, read after this commits (a
        -- joining create held the digest until its commit, so none is missing). An item taking over
        -- an orphaned digest closes it again: retention counts from the last close.
        UPDATE nq_digests d
        SET state = 'closed', closed_at = now(), carrier_id = r.id
        FROM digest_roles r
        WHERE d.bucket = p_bucket
          AND d.id = ANY(ARRAY(SELECT digest_id FROM digest_roles WHERE role = 'carrier'))
          AND d.bucket = r.bucket AND d.id = r.digest_id AND r.role = 'carrier'
        RETURNING d.id
    ), digest_parked AS (
        UPDATE nq_jobs n
        {{_claim_digest_parked}}
        FROM digest_roles r
        WHERE n.bucket = p_bucket AND n.id = ANY(ARRAY(SELECT id FROM digest_roles WHERE role <> 'carrier'))
          AND n.id = r.id
        RETURNING n.id, n.source
    ), kube AS (
        -- Kubernetes rows only: their status writes, by the caller on the coordinator (the
        -- counters do not change: nothing finished).
        SELECT array_agg(c.id) AS ids, array_agg(c.new_status) AS new_statuses
        FROM (SELECT id, source, 'PROCESSING' AS new_status FROM admitted
              UNION ALL SELECT id, source, 'PENDING' FROM held_back
              UNION ALL SELECT id, source, 'PENDING' FROM deferred
              UNION ALL SELECT id, source, 'PENDING' FROM digest_parked) c
        WHERE c.source = 'kubernetes'
    )
    -- Admitted rows in claim order, so the worker starts the most urgent deliveries first; each
    -- carries the channels the claim deferred (the same on every row; one row of NULLs and the
    -- channels when nothing was admitted). the Kubernetes rows' changes
    -- (the caller's outbox), with the acknowledged steps' from before the statement.
    SELECT f.deferred_channels, v_stopped,
           v_kube_ids || COALESCE(f.kube_ids, '{}'),
           array_fill('PENDING'::text, ARRAY[cardinality(v_kube_ids)])
               || array_fill('PENDING'::text, ARRAY[COALESCE(cardinality(f.kube_ids), 0)]),
           v_kube_new || COALESCE(f.kube_new, '{}'), a.*
    FROM (SELECT ARRAY(SELECT channel FROM deferred) AS deferred_channels,
                 (SELECT k.ids FROM kube k) AS kube_ids,
                 (SELECT k.new_statuses FROM kube k) AS kube_new) f
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
               a.next_attempt_at, a.created_at, a.send_at, a.traceparent,
               a.digest_id, a.bucket AS digest_bucket  -- [digests]
        FROM admitted a LEFT JOIN unnest(v_policies) p ON p.name = a.policy
        LEFT JOIN unnest(v_recipients) r ON r.id = a.recipient_id
    ) a ON true
    ORDER BY a.priority, a.next_attempt_at, a.created_at;
END $fn$;

-- nq_claim_admit_bucket's answer, each admitted row with the suppression list's reason for its
-- address (`suppressed`; docs/receipts.md), as nq_claim_v2 answers on plain PostgreSQL: the
-- send-time check of the list inside the claim's one delegated call. The list (a reference
-- table) is read first for the batch's addresses, as an array, and the admission is selected on
-- its own with a lookup in that array per row (its order kept).
CREATE OR REPLACE FUNCTION nq_claim_admit_bucket_v2(
    p_bucket smallint, p_ids uuid[], p_claim_token uuid, p_rate_limit integer,
    p_rate_window_seconds float8, p_lease_seconds float8, p_backoff_base_seconds float8,
    p_backoff_max_seconds float8, p_chain_channels text[], p_chain_heads text[],
    p_known_providers text[], p_quiet_ids uuid[], p_digest_ids uuid[], p_webhook_url text
) RETURNS TABLE (
    deferred_channels text[], escalation_steps_stopped integer, kube_ids uuid[],
    kube_old_statuses text[], kube_new_statuses text[],
    {{_claimed_columns}}, suppressed text)
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $fn$
DECLARE
    v_tenants text[];
    v_channels text[];
    v_addresses text[];
    -- The listed ones of the batch's addresses, as arrays of text (not of the table's row type:
    -- this file is applied to schemas laid out before the list's table exists).
    v_listed_channels text[];
    v_listed_addresses text[];
    v_listed_reasons text[];
BEGIN
    SELECT array_agg(n.tenant), array_agg(n.channel),
           array_agg(nq_normalised_address(n.channel, n.recipient))
    INTO v_tenants, v_channels, v_addresses
    FROM nq_jobs n
    WHERE n.bucket = p_bucket AND n.id = ANY(p_ids);
    SELECT COALESCE(array_agg(s.channel), '{}'), COALESCE(array_agg(s.address), '{}'),
           COALESCE(array_agg(s.reason), '{}')
    INTO v_listed_channels, v_listed_addresses, v_listed_reasons
    FROM nq_suppressions s
    JOIN unnest(v_tenants, v_channels, v_addresses) AS x(tenant, channel, address)
      ON s.tenant = x.tenant AND s.channel = x.channel AND s.address = x.address;
    RETURN QUERY
    SELECT a.*,
           (SELECT l.reason
            FROM unnest(v_listed_channels, v_listed_addresses, v_listed_reasons)
                 AS l(channel, address, reason)
            WHERE l.channel = a.channel
              AND l.address = nq_normalised_address(a.channel, a.recipient)
            LIMIT 1)
    FROM nq_claim_admit_bucket(
        p_bucket, p_ids, p_claim_token, p_rate_limit, p_rate_window_seconds, p_lease_seconds,
        p_backoff_base_seconds, p_backoff_max_seconds, p_chain_channels, p_chain_heads,
        p_known_providers, p_quiet_ids, p_digest_ids, p_webhook_url) AS a;
END $fn$;

-- recover_expired_leases (delivery.sql) within one bucket, delegated to its node: the leases that
-- ran out locked (SKIP LOCKED, oldest first); those on their last attempt DEAD_LETTERED through
-- nq_finish_bucket, the others PENDING again, due now. Returns the counts and the Kubernetes
-- rows' changes for the caller's outbox.
CREATE OR REPLACE FUNCTION nq_recover_expired_leases_bucket(
    p_bucket smallint, p_limit integer, p_default_webhook_url text,
    OUT recovered bigint, OUT dead_lettered bigint, OUT kube_ids uuid[],
    OUT kube_old_statuses text[], OUT kube_new_statuses text[])
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    v_dead uuid[];
    v_dead_errors text[];
    v_live uuid[];
    f record;
    t record;
BEGIN
    recovered := 0; dead_lettered := 0;
    kube_ids := '{}'; kube_old_statuses := '{}'; kube_new_statuses := '{}';
    WITH expired AS (
        SELECT j.id, j.attempt_count, j.max_attempts FROM nq_jobs j
        WHERE j.bucket = p_bucket AND j.status = 'PROCESSING' AND j.lease_expires_at < now()
        ORDER BY j.lease_expires_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    )
    SELECT ARRAY(SELECT e.id FROM expired e WHERE e.attempt_count > e.max_attempts ORDER BY e.id),
           ARRAY(SELECT {{_lease_lost_error}}
                 FROM expired e WHERE e.attempt_count > e.max_attempts ORDER BY e.id),
           ARRAY(SELECT e.id FROM expired e WHERE e.attempt_count <= e.max_attempts)
    INTO v_dead, v_dead_errors, v_live;
    IF cardinality(v_dead) > 0 THEN
        FOR f IN SELECT * FROM nq_finish_bucket(
                p_bucket, v_dead, array_fill('DEAD_LETTERED'::text, ARRAY[cardinality(v_dead)]),
                v_dead_errors, NULL, NULL, NULL, NULL, p_default_webhook_url) LOOP
            dead_lettered := dead_lettered + 1;
            IF f.source = 'kubernetes' THEN
                kube_ids := kube_ids || f.id;
                kube_old_statuses := kube_old_statuses || f.old_status;
                kube_new_statuses := kube_new_statuses || f.status;
            END IF;
        END LOOP;
    END IF;
    IF cardinality(v_live) > 0 THEN
        FOR t IN
            UPDATE nq_jobs n
            SET last_error = {{_lease_lost_error}},
                {{_lease_recovered}}
            WHERE n.bucket = p_bucket AND n.id = ANY(v_live)
            RETURNING n.id, n.source
        LOOP
            recovered := recovered + 1;
            {{_kube_requeued}}
        END LOOP;
    END IF;
    -- As recover_expired_leases: `recovered` counts the dead-lettered too.
    recovered := recovered + dead_lettered;
END $$;

-- Distributed by bucket, co-located with the queue, forced into the caller's transaction (the
-- claim's steps and a completion run in one; nq_finish_bucket is also called by the others on
-- their node, under the same bucket): only when not distributed yet, so a second
-- `migrate` changes nothing (CREATE OR REPLACE above propagates a changed body to every node).
DO $distribute$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'nq_finish_bucket(smallint, uuid[], text[], text[], integer[], text[], text[], jsonb[], text)',
        'nq_complete_bucket(smallint, uuid[], uuid[], text[], float8[], text[], text[], text[], jsonb, boolean[], timestamptz[], boolean[], text[], text[], text[], text)',
        'nq_claim_lock_bucket(smallint, smallint[], text[], integer)',
        'nq_claim_lock_bucket_v2(smallint, smallint[], text[], integer, float8, smallint)',
        'nq_claim_admit_bucket(smallint, uuid[], uuid, integer, float8, float8, float8, float8, text[], text[], text[], uuid[], uuid[], text)',
        'nq_claim_admit_bucket_v2(smallint, uuid[], uuid, integer, float8, float8, float8, float8, text[], text[], text[], uuid[], uuid[], text)',
        'nq_recover_expired_leases_bucket(smallint, integer, text)'
    ] LOOP
        IF NOT EXISTS (SELECT FROM pg_dist_object
                       WHERE classid = 'pg_proc'::regclass AND objid = f::regprocedure
                         AND distribution_argument_index IS NOT NULL) THEN
            PERFORM create_distributed_function(f::regprocedure, distribution_arg_name => 'p_bucket',
                                                colocate_with => 'nq_jobs',
                                                force_delegation => true);
        END IF;
    END LOOP;
END
$distribute$;
