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
-- The lock order is the one every writer of windows uses (claim_admit_candidates): the windows
-- of one call are locked in (bucket, recipient) order, finals and retries of a completion
-- together in one call, as they were in one statement.
CREATE FUNCTION nq_give_back_places(p_buckets smallint[], p_recipients text[], p_ids uuid[])
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_released integer;
BEGIN
    WITH given_back AS (
        SELECT g.bucket, g.recipient, array_agg(g.id) AS ids
        FROM unnest(p_buckets, p_recipients, p_ids) AS g(bucket, recipient, id)
        GROUP BY g.bucket, g.recipient
    ), windows_locked AS (
        SELECT w.bucket, w.recipient FROM nq_rate_windows w
        JOIN given_back g ON g.bucket = w.bucket AND g.recipient = w.recipient
        ORDER BY w.bucket, w.recipient
        FOR UPDATE OF w
    ), released AS (
        UPDATE nq_rate_windows w
        SET (ids, taken) = (
            SELECT COALESCE(array_agg(o.id ORDER BY o.t, o.id), '{}'),
                   COALESCE(array_agg(o.t ORDER BY o.t, o.id), '{}')
            FROM unnest(w.ids, w.taken) AS o(id, t) WHERE o.id <> ALL(g.ids))
        FROM given_back g
        WHERE (w.bucket, w.recipient) IN (SELECT l.bucket, l.recipient FROM windows_locked l)
          AND w.bucket = g.bucket AND w.recipient = g.recipient
        RETURNING 1
    )
    SELECT count(*) INTO v_released FROM released;
    RETURN v_released;
END
$$;
