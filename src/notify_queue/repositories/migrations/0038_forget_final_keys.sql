-- Retention forgets the keys of rows no retry can bring back without locking them
-- (retention's cost: docs/performance.md).
--
-- nq_delivery_log_forget_keys (0011) locks every row of its chunk FOR KEY SHARE before it forgets
-- the row's key, which serialises it with a retry moving that row back to the queue (the race
-- 0011 fixed). But a retry moves only FAILED and DEAD_LETTERED rows (nq_delivery_log_retry, the
-- operator's nq_retry and batch retry, the routed steps on Citus: every DELETE from the log says
-- so), and a row's status in the log never changes. A SENT, CANCELLED, EXPIRED or SUPPRESSED row,
-- most of any partition, can never race a retry, and locking it wrote a heap lock record per row
-- into a partition about to be dropped: 55 of the 115 B of WAL per notification that retention
-- wrote in the cost benchmark. Now only the rows a retry could take are locked (and skipped when
-- a retry moved them meanwhile, as before); the others' keys are forgotten as they are read.
--
-- Expand: the same signature and result; the previous release, which calls it by name, gets it
-- as soon as this runs. On Citus the keys are forgotten by the routed statements of
-- sql/citus.sql, which never locked; the function is replaced there all the same.

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
