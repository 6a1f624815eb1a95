-- The delivery log's partitions past the retention, oldest first.
CREATE OR REPLACE FUNCTION nq_delivery_log_expired(p_retention interval)
RETURNS TABLE (partition_name text, attached boolean, detach_pending boolean)
LANGUAGE sql STABLE AS $$
    SELECT c.relname::text, i.inhrelid IS NOT NULL, COALESCE(i.inhdetachpending, false)
    FROM pg_class c
    LEFT JOIN pg_inherits i ON i.inhrelid = c.oid AND i.inhparent = 'nq_delivery_log'::regclass
    WHERE c.relkind = 'r' AND c.relnamespace = current_schema()::regnamespace
      AND c.relname ~ '^nq_delivery_log_(before_)?[0-9]{8}$'
      AND (to_date(right(c.relname, 8), 'YYYYMMDD')
           + CASE WHEN starts_with(c.relname, 'nq_delivery_log_before_') THEN 0 ELSE 1 END)::timestamp
          AT TIME ZONE 'UTC' <= now() - p_retention
    ORDER BY right(c.relname, 8)
$$;
