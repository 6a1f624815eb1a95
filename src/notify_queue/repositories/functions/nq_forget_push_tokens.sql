-- Push tokens a provider said are gone, removed from their recipients.
CREATE OR REPLACE FUNCTION nq_forget_push_tokens(p_recipient_ids text[], p_tokens text[])
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_updated integer;
BEGIN
    UPDATE nq_recipients rc
    SET push_tokens = ARRAY(SELECT t FROM unnest(rc.push_tokens) t WHERE t <> ALL(g.tokens)),
        updated_at = now()
    FROM (SELECT r.recipient_id, array_agg(r.token) AS tokens
          FROM unnest(p_recipient_ids, p_tokens) AS r(recipient_id, token)
          GROUP BY r.recipient_id) g
    WHERE rc.id = g.recipient_id;
    GET DIAGNOSTICS v_updated = ROW_COUNT;
    RETURN v_updated;
END
$$;
