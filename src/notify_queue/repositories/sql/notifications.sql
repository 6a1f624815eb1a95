-- Queries on nq_notifications used by the API and the operator (enqueue, read, cancel, retry).
-- The worker's hot path (claim, complete, recover) is in delivery.sql.

-- name: notification_insert_many
-- Enqueue a batch in one statement. ON CONFLICT DO NOTHING on the idempotency key: of two
-- identical requests racing, the second waits for the first to commit and then inserts nothing;
-- the caller reads the existing row with notification_get_by_keys (a new statement, so it sees
-- the winner) and compares request hashes to answer 200 or 409. max_attempts is fixed now, from
-- the policy if it has one, so a later policy change does not move notifications in flight.
-- A row may be born final: SUPPRESSED (its recipient opted out of every channel asked for); its
-- webhook event is written by this same statement, like every other reported status change.
WITH inserted AS (
    INSERT INTO nq_notifications (
        id, idempotency_key, request_hash, channel, recipient, subject, body, priority, status,
        send_at, next_attempt_at, expires_at, max_attempts, source, policy, webhook_url, metadata,
        last_error, finished_at, category, recipient_id, template_name, template_version)
    SELECT r.id, r.idempotency_key, r.request_hash, r.channel, r.recipient, r.subject, r.body,
           r.priority, r.status, r.send_at, r.send_at, r.expires_at,
           COALESCE(p.max_attempts, %(default_max_attempts)s), r.source, r.policy, r.webhook_url,
           r.metadata, r.last_error, CASE WHEN r.status <> 'PENDING' THEN now() END, r.category,
           r.recipient_id, r.template_name, r.template_version
    FROM unnest(
        %(ids)s::uuid[], %(idempotency_keys)s::text[], %(request_hashes)s::text[], %(channels)s::text[],
        %(recipients)s::text[], %(subjects)s::text[], %(bodies)s::text[], %(priorities)s::smallint[],
        %(send_ats)s::timestamptz[], %(expires_ats)s::timestamptz[], %(sources)s::text[],
        %(policies)s::text[], %(webhook_urls)s::text[], %(metadatas)s::jsonb[], %(statuses)s::text[],
        %(last_errors)s::text[], %(categories)s::text[], %(recipient_ids)s::text[],
        %(template_names)s::text[], %(template_versions)s::integer[]
    ) WITH ORDINALITY AS r(id, idempotency_key, request_hash, channel, recipient, subject, body,
           priority, send_at, expires_at, source, policy, webhook_url, metadata, status, last_error,
           category, recipient_id, template_name, template_version, position)
    LEFT JOIN nq_policies p ON p.name = r.policy
    -- In batch order, so of a key repeated within one batch the first item is the one inserted (the
    -- join may reorder rows otherwise, and the service answers the later ones 200 or 409).
    ORDER BY r.position
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING *
), events AS (
    SELECT nq_insert_webhook_events(array_agg(id), array_agg(status), array_agg(attempt_count),
                                    array_agg(webhook_url), array_agg(policy),
                                    %(default_webhook_url)s) AS n
    FROM inserted WHERE status = 'SUPPRESSED'
)
-- events is read (once, as an init plan) so that its insert runs.
SELECT i.*, (SELECT n FROM events) AS events_written FROM inserted i

-- name: notification_lock_request_keys
-- Serialise user-targeted requests per idempotency key for this transaction: the expansion reads
-- preferences and then inserts one row per channel, so two identical requests racing must not
-- both expand (with preferences changing in between they could choose different channels). The
-- second waits here, then finds the first one's rows. Sorted keys: no deadlock between batches.
SELECT count(pg_advisory_xact_lock(hashtextextended('nq-request:' || k, 0)))
FROM (SELECT DISTINCT k FROM unnest(%(keys)s::text[]) AS k ORDER BY k) keys

-- name: notification_get_by_keys
SELECT * FROM nq_notifications WHERE idempotency_key = ANY(%(idempotency_keys)s::text[])

-- name: notification_get
SELECT * FROM nq_notifications WHERE id = %(id)s

-- name: notification_list
-- Keyset pagination, oldest first: (created_at, id) strictly after the cursor, so rows added
-- while a client pages (always newer) never shift a page: no gaps, no repeats. Each filter
-- has an index that starts with it and continues with (created_at, id).
SELECT * FROM nq_notifications
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(channel)s::text IS NULL OR channel = %(channel)s)
  AND (%(recipient)s::text IS NULL OR recipient = %(recipient)s)
  AND (%(recipient_id)s::text IS NULL OR recipient_id = %(recipient_id)s)
  AND (%(after_created_at)s::timestamptz IS NULL
       OR (created_at, id) > (%(after_created_at)s::timestamptz, %(after_id)s::uuid))
ORDER BY created_at, id
LIMIT %(limit)s

-- name: notification_cancel
-- Cancel and claim race through this one conditional update: a claim holds the row lock, so this
-- waits for it and then re-checks status = 'PENDING' on the newest row version; whichever commits
-- first wins and the other changes nothing.
UPDATE nq_notifications
SET status = 'CANCELLED', finished_at = now(), updated_at = now()
WHERE id = %(id)s AND status = 'PENDING'
RETURNING *

-- name: notification_retry
-- Operator retry of one notification: back to PENDING with a fresh set of attempts, the retry
-- recorded on the row. Only from FAILED or DEAD_LETTERED (the only way out of a final state).
UPDATE nq_notifications
SET status = 'PENDING', attempt_count = 0, next_attempt_at = now(), last_error = NULL,
    finished_at = NULL, updated_at = now(),
    retries = retries || jsonb_build_array(jsonb_build_object(
        'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'fromStatus', status))
WHERE id = %(id)s AND status IN ('FAILED', 'DEAD_LETTERED')
RETURNING *

-- name: notification_retry_batch
-- Operator retry of up to %(limit)s notifications in one status, oldest first (status index).
-- SKIP LOCKED: two operators retrying at once split the work instead of waiting on each other.
-- Returns the count retried and how many remain, so the caller repeats until none remain.
WITH picked AS (
    SELECT id FROM nq_notifications
    WHERE status = %(status)s
    ORDER BY created_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), retried AS (
    UPDATE nq_notifications n
    SET status = 'PENDING', attempt_count = 0, next_attempt_at = now(), last_error = NULL,
        finished_at = NULL, updated_at = now(),
        retries = n.retries || jsonb_build_array(jsonb_build_object(
            'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
            'fromStatus', n.status))
    FROM picked WHERE n.id = picked.id
    RETURNING n.id
)
SELECT (SELECT count(*) FROM retried) AS retried,
       (SELECT count(*) FROM nq_notifications WHERE status = %(status)s)
         - (SELECT count(*) FROM retried) AS remaining

-- name: notification_wake_workers
-- A hint, not a message: workers LISTEN on nq_wakeup and look for due work when one arrives.
-- Sent after commit by a debounced waker (never one per row); a lost hint costs one poll interval.
SELECT pg_notify('nq_wakeup', '')

-- name: queue_status_counts
-- Counts per status at a cost independent of history (0004_counters.sql): final states from the
-- counters the status triggers keep (a few rows per status), PENDING and PROCESSING from their
-- partial indexes (the claim and lease indexes hold only those rows).
SELECT split_part(name, ':', 2) AS status, sum(n)::bigint AS n
FROM nq_counters WHERE starts_with(name, 'notifications:') GROUP BY name
UNION ALL
SELECT 'PENDING', count(*) FROM nq_notifications WHERE status = 'PENDING'
UNION ALL
SELECT 'PROCESSING', count(*) FROM nq_notifications WHERE status = 'PROCESSING'

-- name: queue_status_due
-- PENDING and due now, per priority, with the oldest due time: reads only the claim index.
SELECT priority, count(*) AS n, min(next_attempt_at) AS oldest_due
FROM nq_notifications
WHERE status = 'PENDING' AND next_attempt_at <= now()
GROUP BY priority

-- name: queue_status_webhooks
-- Delivered and failed events from the counters; pending ones from the dispatch index.
SELECT split_part(name, ':', 2) AS state, sum(n)::bigint AS n
FROM nq_counters WHERE starts_with(name, 'webhooks:') GROUP BY name
UNION ALL
SELECT 'pending', count(*) FROM nq_webhook_events WHERE state = 'pending'

-- name: database_now
SELECT now() AS now
