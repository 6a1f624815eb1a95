-- The API's common batch writes its new idempotency keys by a plain insert, which
-- writes no confirmation record.
-- phase: contract
--
-- nq_enqueue_pending (0024, last replaced by 0033) wrote every key with `ON CONFLICT (key) DO
-- NOTHING`: a speculative insert, which writes a confirmation record besides the row (48 B of WAL
-- per notification), and in the batch's order, so that two batches sharing keys in another order
-- could deadlock. The statement now reads the keys the batch brings first (one probe each) and
-- inserts those not seen plainly, one per key (the batch's first item that carries it), in key
-- order. A key inserted meanwhile by a concurrent create (a client sending the same request
-- twice at once) makes that insert fail on the key: the statement runs in a subtransaction (the
-- block's EXCEPTION clause), which is rolled back, and runs again, now seeing the key (a new
-- statement, a new snapshot); three times at most, then the error stands. Its rows are kept in
-- arrays and returned only once it succeeded, so a failed run returns nothing. The answers are
-- those of 0033 in every case: a row inserted for each key not seen before, none for the others.
--
-- Contract, though nothing of the previous release breaks: the function is 0033's (itself a
-- contract step) with the key insert changed, and an expand step may not depend on a contract
-- step. The rows' hash stays NULL as 0033 made it.
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
                    position bigint)
            ), seen AS (
                SELECT k.key FROM nq_idempotency_keys k
                WHERE k.key = ANY(ARRAY(SELECT r.idempotency_key FROM request r))
            ), keys AS (
                INSERT INTO nq_idempotency_keys (key, notification_id, request_hash)
                SELECT DISTINCT ON (r.idempotency_key COLLATE "C")
                       r.idempotency_key, r.id, r.request_hash
                FROM request r
                WHERE r.idempotency_key NOT IN (SELECT s.key FROM seen s)
                ORDER BY r.idempotency_key COLLATE "C", r.position
                RETURNING notification_id
            ), queued AS (
                INSERT INTO nq_jobs AS n (
                    id, idempotency_key, request_hash, channel, recipient, subject, body,
                    priority, status, send_at, next_attempt_at, expires_at, max_attempts, source,
                    policy, webhook_url, metadata, category, recipient_id, template_name,
                    template_version, bucket, traceparent, waiting_reason, waiting_until,
                    waiting_detail)
                SELECT r.id, r.idempotency_key, NULL, r.channel, r.recipient, r.subject, r.body,
                       r.priority, 'PENDING', r.send_at, r.send_at, r.expires_at,
                       COALESCE(p.max_attempts, p_default_max_attempts), r.source, r.policy,
                       r.webhook_url, r.metadata, r.category, r.recipient_id, r.template_name,
                       r.template_version, nq_bucket(COALESCE(r.recipient_id, r.recipient)),
                       r.traceparent,
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
