-- A digest item joins the open digest of its recipient, channel and key, or opens one.
CREATE OR REPLACE FUNCTION nq_digest_join(
    p_bucket smallint, p_recipient text, p_channel text, p_key text, p_window_seconds integer,
    p_max_items integer, p_template text, p_item uuid,
    OUT digest_id uuid, OUT carrier boolean, OUT closed boolean, OUT closes_at timestamptz,
    OUT item_count integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    d nq_digests;
    -- The transaction's time, read once: a variable is a parameter to the statements below, so
    -- on Citus no now() sits inside the CASE of a distributed UPDATE (refused: "non-IMMUTABLE
    -- functions are not allowed in CASE or COALESCE"). now() is the transaction's start time on
    -- either engine, so plain PostgreSQL writes the same values.
    t timestamptz := now();
BEGIN
    LOOP
        SELECT x.* INTO d FROM nq_digests x
        WHERE x.bucket = p_bucket AND x.recipient = p_recipient AND x.channel = p_channel
          AND x.key = p_key AND x.state = 'open'
        FOR UPDATE;
        IF FOUND AND d.closes_at <= now() THEN
            -- Its window is over but no claim has closed it yet (workers busy or down): it
            -- closes now, at its window's end, and this item opens the next one. Its carrier is
            -- due already.
            UPDATE nq_digests x SET state = 'closed', closed_at = x.closes_at
            WHERE x.bucket = d.bucket AND x.id = d.id;
            CONTINUE;
        END IF;
        IF FOUND THEN
            UPDATE nq_digests x
            SET item_count = x.item_count + 1,
                state = CASE WHEN x.item_count + 1 >= x.max_items THEN 'closed' ELSE 'open' END,
                closed_at = CASE WHEN x.item_count + 1 >= x.max_items THEN t END
            WHERE x.bucket = d.bucket AND x.id = d.id
            RETURNING x.id, x.state = 'closed', x.closes_at, x.item_count
            INTO digest_id, closed, closes_at, item_count;
            carrier := false;
            IF closed THEN
                UPDATE nq_jobs j
                SET next_attempt_at = now(), waiting_reason = NULL, waiting_until = NULL,
                    waiting_detail = NULL, updated_at = now()
                WHERE j.bucket = d.bucket AND j.id = d.carrier_id AND j.status = 'PENDING';
            END IF;
            RETURN;
        END IF;
        INSERT INTO nq_digests AS x (bucket, id, recipient, channel, key, closes_at, max_items,
                                     item_count, template, carrier_id)
        VALUES (p_bucket, gen_random_uuid(), p_recipient, p_channel, p_key,
                now() + make_interval(secs => p_window_seconds), p_max_items, 1, p_template,
                p_item)
        ON CONFLICT (bucket, recipient, channel, key) WHERE state = 'open' DO NOTHING
        RETURNING x.id, x.closes_at INTO digest_id, closes_at;
        IF FOUND THEN
            carrier := true;
            closed := false;
            item_count := 1;
            RETURN;
        END IF;
    END LOOP;
END $$;
