-- A notification's last 20 provider calls, with this attempt's appended. One expression (jsonpath's
-- `last` slice, no subquery), so the planner inlines it into the completion instead of calling a
-- function per result.
CREATE OR REPLACE FUNCTION nq_attempts_append(p_kept jsonb, p_new jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE
    WHEN p_new IS NULL OR jsonb_array_length(p_new) = 0 THEN p_kept
    WHEN jsonb_array_length(p_kept) + jsonb_array_length(p_new) <= 20 THEN p_kept || p_new
    ELSE jsonb_path_query_array(p_kept || p_new, '$[last - 19 to last]')
END;
