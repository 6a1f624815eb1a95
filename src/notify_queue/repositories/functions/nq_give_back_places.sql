-- Give back the places in the recipients' windows of attempts that sent nothing (a completion's
-- failures and retries, a release). Called only by a statement that has some, so a batch with
-- nothing to give back sets up none of these steps. The windows are locked in (bucket,
-- recipient) order, the order every writer of windows uses (nq_claim_v2).
CREATE OR REPLACE FUNCTION nq_give_back_places(
    p_buckets smallint[], p_recipients text[], p_ids uuid[])
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
        {{_window_give_back}}
        FROM given_back g
        WHERE (w.bucket, w.recipient) IN (SELECT l.bucket, l.recipient FROM windows_locked l)
          AND w.bucket = g.bucket AND w.recipient = g.recipient
        RETURNING 1
    )
    SELECT count(*) INTO v_released FROM released;
    RETURN v_released;
END
$$;
