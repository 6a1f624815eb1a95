-- An RFC 3339 time as the API parses it, or the API's error text.
CREATE OR REPLACE FUNCTION nq_parse_rfc3339(p text, OUT moment timestamptz, OUT error text)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    m text[];
BEGIN
    m := regexp_match(p, '^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d{1,9})?([Zz]|([+-])(\d{2}):(\d{2}))$');
    IF m IS NULL THEN
        error := 'must be an RFC 3339 date-time with an offset, e.g. 2026-09-24T12:00:00Z';
        RETURN;
    END IF;
    IF m[1]::int < 1 OR m[4]::int > 23 OR m[5]::int > 59 OR m[6]::int > 59
       OR COALESCE(m[10]::int, 0) > 23 OR COALESCE(m[11]::int, 0) > 59 THEN
        error := 'is not a valid date-time';
        RETURN;
    END IF;
    BEGIN
        -- Python keeps microseconds: trim digits past the sixth.
        moment := (m[1] || '-' || m[2] || '-' || m[3] || ' ' || m[4] || ':' || m[5] || ':'
                   || m[6] || COALESCE(substr(m[7], 1, 7), '') || ' '
                   || CASE WHEN upper(m[8]) = 'Z' THEN '+00:00' ELSE m[8] END)::timestamptz;
    EXCEPTION WHEN datetime_field_overflow OR invalid_datetime_format
                   OR invalid_time_zone_displacement_value THEN
        error := 'is not a valid date-time';
        RETURN;
    END;
    -- datetime's range, in UTC (year 1 with a positive offset leaves it).
    IF moment < '0001-01-01 00:00:00+00' OR moment >= '10000-01-01 00:00:00+00' THEN
        moment := NULL;
        error := 'is not a valid date-time';
    END IF;
END $$;
