-- A partition past the retention detached and dropped for a caller that does not own the log
-- (the runtime role); only the log's day partitions, whatever the caller passes.
CREATE OR REPLACE FUNCTION nq_delivery_log_retire(p_partition text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    pending boolean;
BEGIN
    IF p_partition !~ '^nq_delivery_log_(before_)?[0-9]{8}$' OR to_regclass(p_partition) IS NULL
    THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = p_partition || ' is not a partition of nq_delivery_log';
    END IF;
    SELECT i.inhdetachpending INTO pending FROM pg_inherits i
    WHERE i.inhrelid = to_regclass(p_partition) AND i.inhparent = 'nq_delivery_log'::regclass;
    IF pending THEN  -- a concurrent detach the owner started was interrupted
        EXECUTE 'ALTER TABLE nq_delivery_log DETACH PARTITION ' || quote_ident(p_partition)
                || ' FINALIZE';
    ELSIF FOUND THEN
        EXECUTE 'ALTER TABLE nq_delivery_log DETACH PARTITION ' || quote_ident(p_partition);
    END IF;
    RETURN nq_delivery_log_drop(p_partition);
END $$;

DO $$
BEGIN
    EXECUTE 'ALTER FUNCTION nq_delivery_log_retire(text) SET search_path = '
            || quote_ident(current_schema()) || ', pg_temp';
END $$;
