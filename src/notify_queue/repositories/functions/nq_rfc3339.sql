-- A time as the API writes it (UTC, `Z`).
CREATE OR REPLACE FUNCTION nq_rfc3339(p timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN p IS NULL THEN NULL ELSE
    to_char(p AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
    || CASE WHEN to_char(p AT TIME ZONE 'UTC', 'US') = '000000' THEN ''
            ELSE to_char(p AT TIME ZONE 'UTC', '.US') END
    || 'Z' END;
