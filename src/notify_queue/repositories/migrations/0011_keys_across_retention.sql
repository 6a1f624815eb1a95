-- Idempotency keys across retention. Expand-only: two functions of 0008 replaced with
-- the same signatures and results, so 0.1.0's API and workers, which call them by name during an
-- upgrade, get the fix as soon as this runs.
--
-- The fault: retention forgets the keys of a partition (nq_delivery_log_forget_keys, in chunks)
-- before it detaches it, and a retry (nq_delivery_log_retry) moves a FAILED or DEAD_LETTERED row
-- from the log back to the queue. A retry of a row of that partition during the run could move
-- it after its key was forgotten (or while the chunk that forgot it was running on an older
-- snapshot): the notification was live again without its key, and a create with the same key
-- made a second notification.
--
-- The fix serialises the two per row, with the row's lock in the log and its key's lock:
--   forget   locks each row of the chunk (FOR KEY SHARE: it conflicts with the retry's DELETE
--            and with FOR UPDATE, nothing else) and forgets only the keys of the rows it locked.
--            A row a retry moved is gone when the lock is granted and is skipped: its key stays.
--   retry    locks the rows (FOR UPDATE, waiting for a forget chunk holding them to commit),
--            then their keys (FOR KEY SHARE), and moves only rows whose key is still theirs. A
--            row whose key a forget chunk deleted and committed is skipped: it is on its way out
--            with its partition and cannot come back.
-- Whichever takes a row first, the key and the live row stay together: a retried notification
-- keeps its key, a forgotten key belongs to a row that retention drops. Both take the rows in id
-- order and a row's key only after the row, so they cannot deadlock; the batch retry's
-- FOR UPDATE SKIP LOCKED (notifications.sql) skips rows a forget chunk holds.

-- Retry (the only way out of a final state): FAILED or DEAD_LETTERED rows move from the log back
-- to the queue, PENDING with a fresh set of attempts and the retry recorded on the row; each row
-- is retried once (a second retry waits for the first one's row lock, then finds nothing). Only
-- rows whose idempotency key is still theirs: see the top of this file.
CREATE OR REPLACE FUNCTION nq_delivery_log_retry(p_ids uuid[]) RETURNS SETOF nq_queue
LANGUAGE sql VOLATILE AS $$
    WITH held AS (
        SELECT l.id, l.idempotency_key FROM nq_delivery_log l
        WHERE l.id = ANY(p_ids) AND l.status IN ('FAILED', 'DEAD_LETTERED')
        ORDER BY l.id
        FOR UPDATE
    ), keyed AS (
        -- A key deleted by a forget chunk that committed while this waited is skipped by the
        -- lock (READ COMMITTED), so its row is not moved.
        SELECT h.id FROM held h
        JOIN nq_idempotency_keys k ON k.key = h.idempotency_key AND k.notification_id = h.id
        FOR KEY SHARE OF k
    ), moved AS (
        DELETE FROM nq_delivery_log
        WHERE id = ANY(ARRAY(SELECT id FROM keyed)) AND status IN ('FAILED', 'DEAD_LETTERED')
        RETURNING *
    )
    INSERT INTO nq_queue
    SELECT id, idempotency_key, request_hash, channel, recipient, subject, body, priority,
           'PENDING', send_at, now(), expires_at, 0, max_attempts, NULL, sent_at,
           provider_message_id, NULL, NULL,
           retries || jsonb_build_array(jsonb_build_object(
               'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
               'fromStatus', status)),
           source, policy, webhook_url, metadata, created_at, now(), NULL, recipient_id, category,
           template_name, template_version, provider, delivery_attempts
    FROM moved
    RETURNING *
$$;
