-- Notify Queue on Citus, every role (docs/scaling.md "Citus: every role"), expand step.
--
-- Retention's key cleanup for Citus, where the partition's rows cannot be locked (FOR KEY SHARE
-- runs only in a query on one shard) in the statement that deletes keys from another
-- distribution. A plain PostgreSQL database never calls it (repositories/delivery_log.py chooses
-- by the engine). The enqueue function's two-statement key read, which Citus also needs, is in
-- 0016, where that function has its one definition in this release.

-- nq_delivery_log_forget_keys (0011) without the lock on the partition's rows. What the lock
-- kept: a retry that moves a row of an expired partition back to the queue while its key is
-- being forgotten keeps the row and loses the key. On Citus that race is left open (a retry of
-- a notification older than the retention, during the minute its partition is dropped); the
-- chunks and their order are those of 0011.
CREATE FUNCTION nq_delivery_log_forget_keys_unlocked(p_partition text, p_after uuid,
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
