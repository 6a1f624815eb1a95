-- nq_delivery_log_forget_keys for Citus, without the lock on the partition's rows (FOR KEY
-- SHARE runs only in a single-shard query there); repositories/delivery_log.py chooses.
CREATE OR REPLACE FUNCTION nq_delivery_log_forget_keys_unlocked(p_partition text, p_after uuid,
                                                     p_limit integer)
RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    last_id uuid;
    chunk_ids uuid[];
    chunk_keys text[];
BEGIN
    -- Two statements: the chunk of the partition (by bucket) read first, then its keys (by key)
    -- deleted; Citus plans no DELETE of one distribution joined to a CTE over another.
    EXECUTE
        'SELECT array_agg(id ORDER BY id), array_agg(idempotency_key ORDER BY id) FROM'
        || ' (SELECT id, idempotency_key FROM ' || quote_ident(p_partition)
        || '  WHERE id > $1 ORDER BY id LIMIT $2) c'
    INTO chunk_ids, chunk_keys USING p_after, p_limit;
    IF chunk_ids IS NULL THEN
        RETURN NULL;
    END IF;
    DELETE FROM nq_idempotency_keys k
    WHERE k.key = ANY(chunk_keys)
      AND (k.key, k.notification_id) IN (SELECT * FROM unnest(chunk_keys, chunk_ids));
    last_id := chunk_ids[cardinality(chunk_ids)];
    RETURN last_id;
END $$;
