-- The partitions whose part of nq_delivery_log_unsent is not attached yet (0009 and 0015 call it).
CREATE OR REPLACE FUNCTION nq_delivery_log_unsent_missing()
RETURNS TABLE (partition_name text, index_name text, index_valid boolean, has_rows boolean)
LANGUAGE sql STABLE AS $$
    SELECT partition_name, index_name, index_valid, has_rows
    FROM nq_delivery_log_index_missing('nq_delivery_log_unsent')
$$;
