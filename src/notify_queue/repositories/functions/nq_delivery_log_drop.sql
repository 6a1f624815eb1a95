-- A retired partition of the delivery log dropped; its row count.
CREATE OR REPLACE FUNCTION nq_delivery_log_drop(p_partition text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    dropped bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass(p_partition)) THEN
        RAISE EXCEPTION USING MESSAGE = p_partition || ' is still attached to nq_delivery_log';
    END IF;
    EXECUTE
        'WITH counted AS (SELECT status, count(*) AS n FROM ' || quote_ident(p_partition)
        || ' GROUP BY status),'
        || ' subtracted AS (INSERT INTO nq_counters AS c (name, shard, n)'
        || '   SELECT ''notifications:'' || status, mod(pg_backend_pid(), 16), -n FROM counted'
        || '   ORDER BY 1 ON CONFLICT (name, shard) DO UPDATE SET n = c.n + excluded.n)'
        || ' SELECT COALESCE(sum(n), 0) FROM counted'
    INTO dropped;
    EXECUTE 'DROP TABLE ' || quote_ident(p_partition);
    RETURN dropped;
END $$;
