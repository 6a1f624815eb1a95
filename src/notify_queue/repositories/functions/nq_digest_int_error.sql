-- The message for a digest field that is not an integer in [lo, hi], NULL when it is.
CREATE OR REPLACE FUNCTION nq_digest_int_error(v jsonb, lo integer, hi integer) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE
    WHEN jsonb_typeof(v) IS DISTINCT FROM 'number' OR v::text !~ '^-?[0-9]+$'
        THEN 'Input should be a valid integer'
    WHEN v::text::numeric < lo THEN 'Input should be greater than or equal to ' || lo
    WHEN v::text::numeric > hi THEN 'Input should be less than or equal to ' || hi
END;
