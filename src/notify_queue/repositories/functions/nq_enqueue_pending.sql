-- The API's common batch of PENDING creates (no digest item): new keys inserted in key order,
-- rows returned with the columns the server decides; `p_wake` wakes workers at commit.
CREATE OR REPLACE FUNCTION nq_enqueue_pending(
    p_items json, p_default_max_attempts integer, p_wake boolean
) RETURNS TABLE (
    id uuid, max_attempts integer, created_at timestamptz, updated_at timestamptz,
    waiting_reason text, waiting_until timestamptz, waiting_detail text, metadata jsonb)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_ids uuid[];
    v_max_attempts integer[];
    v_created_at timestamptz[];
    v_updated_at timestamptz[];
    v_waiting_reason text[];
    v_waiting_until timestamptz[];
    v_waiting_detail text[];
    v_metadata jsonb[];
BEGIN
    FOR attempt IN 1..3 LOOP
        BEGIN
            WITH request AS (
                SELECT * FROM json_to_recordset(p_items) AS r(
                    id uuid, idempotency_key text, request_hash text, channel text,
                    recipient text, subject text, body text, priority smallint,
                    send_at timestamptz, expires_at timestamptz, source text, policy text,
                    webhook_url text, metadata jsonb, category text, recipient_id text,
                    template_name text, template_version integer, traceparent text,
                    position bigint, tenant text)
            ), seen AS (
                SELECT k.key FROM nq_idempotency_keys k
                WHERE k.key = ANY(ARRAY(SELECT r.idempotency_key FROM request r))
            ), keys AS (
                INSERT INTO nq_idempotency_keys (key, notification_id, request_digest)
                SELECT DISTINCT ON (r.idempotency_key COLLATE "C")
                       r.idempotency_key, r.id, decode(left(r.request_hash, 32), 'hex')
                FROM request r
                WHERE r.idempotency_key NOT IN (SELECT s.key FROM seen s)
                ORDER BY r.idempotency_key COLLATE "C", r.position
                RETURNING notification_id
            ), queued AS (
                INSERT INTO nq_jobs AS n (
                    id, idempotency_key, request_hash, channel, recipient, subject, body,
                    priority, status, send_at, next_attempt_at, expires_at, max_attempts, source,
                    policy, webhook_url, metadata, category, recipient_id, template_name,
                    template_version, bucket, traceparent, tenant, waiting_reason,
                    waiting_until, waiting_detail)
                SELECT r.id, r.idempotency_key, NULL, r.channel, r.recipient, r.subject, r.body,
                       r.priority, 'PENDING', r.send_at, r.send_at, r.expires_at,
                       COALESCE(p.max_attempts, p_default_max_attempts), r.source, r.policy,
                       r.webhook_url, r.metadata, r.category, r.recipient_id, r.template_name,
                       r.template_version, nq_bucket(COALESCE(r.recipient_id, r.recipient)),
                       r.traceparent, COALESCE(r.tenant, 'default'),
                       CASE WHEN r.send_at > now() THEN 'Scheduled' END,
                       CASE WHEN r.send_at > now() THEN r.send_at END,
                       CASE WHEN r.send_at > now() THEN 'sendAt is in the future' END
                FROM request r
                JOIN keys k ON k.notification_id = r.id
                LEFT JOIN nq_policies p ON p.name = r.policy
                RETURNING n.id, n.max_attempts, n.created_at, n.updated_at, n.waiting_reason,
                          n.waiting_until, n.waiting_detail, n.metadata
            ), woken AS (
                -- A hint, not a message (notification_wake_workers); one per statement at
                -- most, and only when it inserted a row: a statement of existing keys only
                -- wakes nobody. Counted, not selected: Citus keeps a CTE's rows as an
                -- intermediate result, which cannot hold a void.
                SELECT count(*) AS sent FROM pg_notify('nq_wakeup', '')
                WHERE p_wake AND EXISTS (SELECT FROM queued)
            )
            -- woken is read (once, as an init plan) so that it runs.
            SELECT array_agg(q.id), array_agg(q.max_attempts), array_agg(q.created_at),
                   array_agg(q.updated_at), array_agg(q.waiting_reason),
                   array_agg(q.waiting_until), array_agg(q.waiting_detail),
                   array_agg(q.metadata)
            INTO v_ids, v_max_attempts, v_created_at, v_updated_at, v_waiting_reason,
                 v_waiting_until, v_waiting_detail, v_metadata
            FROM queued q WHERE (SELECT w.sent FROM woken w) >= 0;
            EXIT;
        EXCEPTION WHEN unique_violation THEN
            IF attempt = 3 THEN
                RAISE;
            END IF;
        END;
    END LOOP;
    RETURN QUERY
    SELECT * FROM unnest(v_ids, v_max_attempts, v_created_at, v_updated_at, v_waiting_reason,
                         v_waiting_until, v_waiting_detail, v_metadata);
END
$$;

-- Plans that read the keys and policies by their primary keys at any table size: with the
-- statistics of a young table the planner chose to read all keys and kept that plan.
ALTER FUNCTION nq_enqueue_pending(json, integer, boolean) SET enable_seqscan = off;
