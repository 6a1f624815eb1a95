-- The places in the recipients' windows that a completion gives back, and the push tokens a
-- provider said are gone, as functions the statements call only when they have some. Expand only:
-- two new functions; nothing the previous release calls changes.
--
-- complete_deliveries gave places back and removed gone push tokens in steps of its own (an
-- UPDATE of nq_recipients, a FOR UPDATE read and an UPDATE of nq_rate_windows). A step of a
-- statement costs its plan's set-up on every run, rows or none: the executor opens the table
-- and its indexes for each UPDATE and locks each relation the plan names, 1.3 us per result in a
-- batch of 100 where every result was SENT (most batches), which gives nothing back. Called as
-- a function under a `HAVING count(*) > 0`, the steps are set up only in a batch that has
-- something to give back. release_claims gives places back through the same function, so the
-- give-back is written once.
--
-- nq_give_back_places: source code now, functions/nq_give_back_places.sql.

-- One row per recipient (an UPDATE ... FROM applies one joined row per target row).
CREATE FUNCTION nq_forget_push_tokens(p_recipient_ids text[], p_tokens text[])
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
