-- The delivery log's day partitions for today and the days ahead, each with REPLICA IDENTITY
-- FULL (Citus moves shards by logical replication); the number made.
CREATE OR REPLACE FUNCTION nq_delivery_log_prepare(p_days_ahead integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    day     date;
    name    text;
    created integer := 0;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('nq delivery log partitions', 0));
    FOR day IN SELECT generate_series((now() AT TIME ZONE 'UTC')::date,
                                      (now() AT TIME ZONE 'UTC')::date + p_days_ahead, '1 day')::date
    LOOP
        name := 'nq_delivery_log_' || to_char(day, 'YYYYMMDD');
        CONTINUE WHEN to_regclass(name) IS NOT NULL;
        EXECUTE 'CREATE TABLE ' || quote_ident(name)
            || ' (LIKE nq_delivery_log INCLUDING DEFAULTS INCLUDING CONSTRAINTS)';
        EXECUTE 'ALTER TABLE ' || quote_ident(name) || ' REPLICA IDENTITY FULL';
        EXECUTE 'ALTER TABLE nq_delivery_log ATTACH PARTITION ' || quote_ident(name)
            || ' FOR VALUES FROM (' || quote_literal(day::timestamp AT TIME ZONE 'UTC')
            || ') TO (' || quote_literal((day + 1)::timestamp AT TIME ZONE 'UTC') || ')';
        created := created + 1;
    END LOOP;
    RETURN created;
END $$;

-- The runtime role may not create tables, so the function runs as its owner; its search_path is
-- fixed, pg_catalog after the schema (a test's clock is a `now()` there).
DO $$
BEGIN
    EXECUTE 'ALTER FUNCTION nq_delivery_log_prepare(integer) SECURITY DEFINER SET search_path = '
            || quote_ident(current_schema()) || ', pg_catalog, pg_temp';
END $$;
