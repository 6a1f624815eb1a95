-- The errors for metadata nested deeper than the API allows.
CREATE OR REPLACE FUNCTION nq_json_depth_errors(p jsonb, p_path text, p_depth integer) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    found jsonb := '[]';
    e record;
BEGIN
    IF jsonb_typeof(p) NOT IN ('object', 'array') THEN
        RETURN found;
    END IF;
    IF p_depth >= 32 THEN
        RETURN jsonb_build_array(jsonb_build_object(
            'field', COALESCE(NULLIF(p_path, ''), '$'),
            'message', 'nests deeper than 32 levels'));
    END IF;
    IF jsonb_typeof(p) = 'object' THEN
        FOR e IN SELECT key, value FROM jsonb_each(p) LOOP
            found := found || nq_json_depth_errors(
                e.value, CASE WHEN p_path = '' THEN e.key ELSE p_path || '.' || e.key END,
                p_depth + 1);
        END LOOP;
    ELSE
        FOR e IN SELECT value, ordinality - 1 AS i FROM jsonb_array_elements(p) WITH ORDINALITY
        LOOP
            found := found || nq_json_depth_errors(e.value, p_path || '[' || e.i || ']',
                                                   p_depth + 1);
        END LOOP;
    END IF;
    RETURN found;
END $$;
