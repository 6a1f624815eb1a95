-- One chunk of an expiring partition's idempotency keys forgotten; the last id, NULL when done.
-- Locks only the rows a retry could move back (FAILED, DEAD_LETTERED).
CREATE OR REPLACE FUNCTION nq_delivery_log_forget_keys(p_partition text, p_after uuid, p_limit integer)
RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    last_id uuid;
BEGIN
    -- Through the partition's id index, p_limit rows at a time: a short transaction per chunk.
    -- `scanned` says where the next chunk starts (rows a retry moved meanwhile included, so a
    -- chunk of moved rows does not end the loop); `held` is what is still in the partition of
    -- the rows a retry could move, once locked; `final` the rows no retry takes. Only the keys of
    -- `held` and `final` are forgotten.
    EXECUTE
        'WITH scanned AS (SELECT id, idempotency_key, status FROM ' || quote_ident(p_partition)
        || '             WHERE id > $1 ORDER BY id LIMIT $2),'
        || ' held AS (SELECT p.id, p.idempotency_key FROM ' || quote_ident(p_partition) || ' p'
        || '          WHERE p.id = ANY(ARRAY(SELECT id FROM scanned'
        || '                                 WHERE status IN (''FAILED'', ''DEAD_LETTERED'')))'
        || '          ORDER BY p.id FOR KEY SHARE),'
        || ' final AS (SELECT id, idempotency_key FROM scanned'
        || '           WHERE status NOT IN (''FAILED'', ''DEAD_LETTERED'')),'
        || ' gone AS (DELETE FROM nq_idempotency_keys k'
        || '          USING (SELECT * FROM held UNION ALL SELECT * FROM final) h'
        || '          WHERE k.key = h.idempotency_key AND k.notification_id = h.id)'
        || ' SELECT max(id::text)::uuid FROM scanned'
    INTO last_id USING p_after, p_limit;
    RETURN last_id;
END $$;
