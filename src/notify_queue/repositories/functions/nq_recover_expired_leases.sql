-- A lease that ran out means its worker died (or hangs): put the notification back to be tried
-- again with the same idempotency key, the attempt still counted. A crash on the last attempt
-- gets one final re-check (attempt max+1, same key: a provider that already delivered it says
-- so); a crash during that re-check dead-letters it, so a poison notification never loops.
-- Returns how many were recovered (the dead-lettered among them).
CREATE OR REPLACE FUNCTION nq_recover_expired_leases(p_limit integer, p_default_webhook_url text)
RETURNS TABLE (recovered bigint, dead_lettered bigint, noted integer)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_dead uuid[];
    v_dead_errors text[];
    v_live uuid[];
    v_ids uuid[];
    v_sources text[];
BEGIN
    -- The leases that ran out, oldest first. SKIP LOCKED: several workers may run this at once;
    -- each row is recovered once.
    WITH expired AS (
        SELECT id, attempt_count, max_attempts FROM nq_jobs
        WHERE status = 'PROCESSING' AND lease_expires_at < now()
        ORDER BY lease_expires_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    )
    SELECT array_agg(id) FILTER (WHERE attempt_count > max_attempts),
           array_agg({{_lease_lost_error}}) FILTER (WHERE attempt_count > max_attempts),
           array_agg(id) FILTER (WHERE attempt_count <= max_attempts)
    INTO v_dead, v_dead_errors, v_live
    FROM expired;
    recovered := 0;
    dead_lettered := 0;

    -- Lost during the final re-check: DEAD_LETTERED.
    IF v_dead IS NOT NULL THEN
        SELECT count(*) INTO dead_lettered
        FROM nq_finish_held(
            v_dead, NULL, array_fill('DEAD_LETTERED'::text, ARRAY[cardinality(v_dead)]),
            v_dead_errors, NULL, NULL, NULL, NULL, p_default_webhook_url);
    END IF;

    -- The others: PENDING again, due now.
    IF v_live IS NOT NULL THEN
        WITH put_back AS (
            UPDATE nq_jobs n
            SET last_error = {{_lease_lost_error}},
                {{_lease_recovered}}
            WHERE n.id = ANY(v_live)
            RETURNING n.id, n.source
        )
        SELECT array_agg(id), array_agg(source) INTO v_ids, v_sources FROM put_back;
        recovered := COALESCE(cardinality(v_ids), 0);
        -- Kubernetes rows' status writes (PROCESSING and PENDING are not counted).
        IF 'kubernetes' = ANY(v_sources) THEN
            noted := nq_note_changes(
                v_ids, v_sources, array_fill('PROCESSING'::text, ARRAY[cardinality(v_ids)]),
                array_fill('PENDING'::text, ARRAY[cardinality(v_ids)]));
        END IF;
    END IF;
    -- `recovered` counts the dead-lettered too.
    recovered := recovered + dead_lettered;
    RETURN NEXT;
END $$;
