-- The retry of FAILED or DEAD_LETTERED notifications: each moved from the log back into the
-- queue, PENDING and due now with its attempts reset, its retry recorded; then the status writes
-- and counters of what moved. Returns the ids queued again.
CREATE OR REPLACE FUNCTION nq_retry(p_ids uuid[]) RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_ids uuid[];
    v_sources text[];
    v_from text[];
BEGIN
    -- Move: the log rows locked, their keys checked, deleted from the log, inserted into the
    -- queue (every CTE here writes or feeds a write, so each runs).
    WITH held AS (
        SELECT l.id, l.idempotency_key FROM nq_delivery_log l
        WHERE l.id = ANY(p_ids) AND l.status IN ('FAILED', 'DEAD_LETTERED')
        ORDER BY l.id
        FOR UPDATE
    ), keyed AS (
        -- A key deleted by a forget chunk that committed while this waited is skipped by the
        -- lock (READ COMMITTED), so its row is not moved.
        SELECT h.id FROM held h
        JOIN nq_idempotency_keys k ON k.key = h.idempotency_key AND k.notification_id = h.id
        FOR KEY SHARE OF k
    ), moved AS (
        DELETE FROM nq_delivery_log
        WHERE id = ANY(ARRAY(SELECT id FROM keyed)) AND status IN ('FAILED', 'DEAD_LETTERED')
        RETURNING *
    ), queued AS (
        INSERT INTO nq_jobs ({{_moved_columns}})
        SELECT {{_retried_values}},
               COALESCE(bucket, nq_bucket(COALESCE(recipient_id, recipient))), digest_id,
               escalation_id, traceparent, tenant
        FROM moved
        RETURNING id
    )
    SELECT array_agg(m.id), array_agg(m.source), array_agg(m.status)
    INTO v_ids, v_sources, v_from
    FROM moved m;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    -- The counters and the operator's status writes of what moved.
    PERFORM nq_note_changes(v_ids, v_sources, v_from,
                            array_fill('PENDING'::text, ARRAY[cardinality(v_ids)]));
    RETURN QUERY SELECT unnest(v_ids);
END $$;
