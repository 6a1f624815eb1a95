-- Graceful shutdown: hand claimed-but-unsent notifications back at once (PENDING, due now),
-- giving back the attempt the claim counted and the place in the window it took (the
-- notification was never tried). A row is handed back only while it is PROCESSING under the
-- claim token given. Returns how many were handed back.
CREATE OR REPLACE FUNCTION nq_release_claims(p_ids uuid[], p_claim_tokens uuid[])
RETURNS TABLE (released integer, noted integer)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_ids uuid[];
    v_sources text[];
    v_buckets smallint[];
    v_recipients text[];
BEGIN
    -- Hand back.
    WITH handed_back AS (
        UPDATE nq_jobs n
        {{_claim_released}}
        FROM unnest(p_ids, p_claim_tokens) AS r(id, claim_token)
        WHERE n.id = ANY(p_ids) AND n.id = r.id AND n.claim_token = r.claim_token
          AND n.status = 'PROCESSING'
        RETURNING n.id, n.source, n.bucket, n.recipient
    )
    SELECT array_agg(id), array_agg(source), array_agg(bucket), array_agg(recipient)
    INTO v_ids, v_sources, v_buckets, v_recipients
    FROM handed_back;
    released := COALESCE(cardinality(v_ids), 0);
    IF v_ids IS NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;

    -- Kubernetes rows' status writes (PROCESSING and PENDING are not counted).
    IF 'kubernetes' = ANY(v_sources) THEN
        noted := nq_note_changes(
            v_ids, v_sources, array_fill('PROCESSING'::text, ARRAY[released]),
            array_fill('PENDING'::text, ARRAY[released]));
    END IF;

    -- The places in the windows they took.
    PERFORM nq_give_back_places(v_buckets, v_recipients, v_ids);
    RETURN NEXT;
END $$;
