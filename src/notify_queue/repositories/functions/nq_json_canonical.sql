-- A JSON value as canonical text (sorted keys), for the request hash.
CREATE OR REPLACE FUNCTION nq_json_canonical(p jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    CASE jsonb_typeof(p)
    WHEN 'object' THEN
        RETURN '{' || COALESCE((SELECT string_agg(to_json(e.key)::text || ':'
                                                  || nq_json_canonical(e.value), ','
                                                  ORDER BY e.key COLLATE "C")
                                FROM jsonb_each(p) e), '') || '}';
    WHEN 'array' THEN
        RETURN '[' || COALESCE((SELECT string_agg(nq_json_canonical(e.value), ','
                                                  ORDER BY e.ordinality)
                                FROM jsonb_array_elements(p) WITH ORDINALITY e), '') || ']';
    ELSE
        RETURN p::text;
    END CASE;
END $$;
