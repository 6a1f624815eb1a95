-- Today's delivery log partition made if missing (the first writer of a new day).
CREATE OR REPLACE FUNCTION nq_delivery_log_ready() RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF to_regclass('nq_delivery_log_' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')) IS NULL THEN
        PERFORM nq_delivery_log_prepare(7);
    END IF;
    RETURN true;
END $$;
