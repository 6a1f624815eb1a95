-- Queries of the API and the operator (enqueue, read, cancel, retry). Unfinished notifications
-- are in nq_jobs, finished ones in nq_delivery_log, and nq_all_notifications is the view over
-- both (0009); reads go through the view, writes to the table the row is in.
-- The worker's hot path (claim, complete, recover) is in delivery.sql.

-- name: _notification_columns
-- What a read of a notification returns (repositories/rows.py maps it by name), from a row `n`.
n.id, n.idempotency_key, n.channel, n.recipient, n.subject, n.body, n.priority,
n.status, n.send_at, n.next_attempt_at, n.expires_at, n.attempt_count, n.max_attempts,
n.last_error, n.sent_at, n.provider_message_id, n.retries, n.source, n.policy, n.webhook_url,
n.metadata, n.created_at, n.updated_at, n.finished_at, n.recipient_id, n.category,
n.template_name, n.template_version, n.provider, n.delivery_attempts, n.bucket, n.waiting_reason,
n.waiting_until, n.waiting_detail, n.digest_id, n.escalation_id, n.traceparent

-- name: notification_insert_many
-- Enqueue a batch in one statement: nq_insert_notifications, the one insert path that
-- notify_queue_enqueue, the SQL door, shares. The idempotency keys are inserted first, ON
-- CONFLICT DO NOTHING: of two identical requests racing, the second waits for the first to
-- commit and then inserts no key, so no row; the caller reads the existing row with
-- notification_get_by_keys (a new statement, so it sees the winner) and compares request hashes
-- to answer 200 or 409. The keys table is unique across the queue and the log, wherever the
-- first row is now. max_attempts is fixed now, from the policy if it has one, so a later policy
-- change does not move notifications in flight. A row may be born final: SUPPRESSED (its
-- recipient opted out of every channel asked for). It goes straight into the log, counted, with
-- its webhook event, written by this same statement like every other status change (the caller
-- has made sure the log has today's partition: nq_delivery_log_ready). A row sent later waits
-- `Scheduled`. The batch is one JSON array of objects: one parameter, parsed by the server,
-- instead of twenty arrays whose elements the driver would quote and escape one by one.
SELECT * FROM nq_insert_notifications(%(items)s::json, %(default_max_attempts)s,
                                      %(default_webhook_url)s)

-- name: notification_enqueue_pending
-- notification_insert_many for the API's common batch, every row PENDING and none a digest's item
-- (nq_enqueue_pending_v2 over nq_enqueue_pending): no log half; `suppressed` true, and nothing
-- inserted, when an address of the batch is on the suppression list; the workers' wake-up sent
-- in this statement's transaction when %(wake)s and a row was inserted (the caller's debounced
-- waker decides), and
-- only the columns the server decides returned: the caller builds each notification from its
-- request and these (repositories.rows.enqueued_notifications).
-- Read as one row of arrays, an element per inserted row (in no set order: the caller matches
-- them by id): rows cost the driver a dict and a call per column each, where arrays decode in one
-- call per column. created_at and updated_at are the columns' default, now(),
-- the same for every row of one transaction: one value each, and each one's array only when its
-- rows differ (never on one server; said, not assumed, for an engine that fills defaults
-- elsewhere).
SELECT array_agg(e.id) AS ids, array_agg(e.max_attempts) AS max_attempts,
       min(e.created_at) AS created_at, min(e.updated_at) AS updated_at,
       CASE WHEN min(e.created_at) <> max(e.created_at) THEN array_agg(e.created_at) END
           AS created_ats,
       CASE WHEN min(e.updated_at) <> max(e.updated_at) THEN array_agg(e.updated_at) END
           AS updated_ats,
       array_agg(e.waiting_reason) AS waiting_reasons,
       array_agg(e.waiting_until) AS waiting_untils,
       array_agg(e.waiting_detail) AS waiting_details,
       array_agg(e.metadata) AS metadata, COALESCE(bool_or(e.suppressed), false) AS suppressed
FROM nq_enqueue_pending_v2(%(items)s::json, %(default_max_attempts)s, %(wake)s) AS e

-- name: notification_insert_many_digests
-- notification_insert_many for a batch with a digest's item (0009, docs/digests.md): each such
-- item joins its recipient's open digest (nq_digest_join) in this statement; the batch's other
-- rows are inserted as there. A plain batch never runs this one (it plans the digest steps).
SELECT * FROM nq_insert_digest_items(%(items)s::json, %(default_max_attempts)s,
                                     %(default_webhook_url)s)

-- name: notification_log_ready
-- Before an insert of rows born final: the log has today's partition (0009).
SELECT nq_delivery_log_ready() AS ready

-- name: notification_lock_request_keys
-- Serialise user-targeted requests per idempotency key for this transaction: the expansion reads
-- preferences and then inserts one row per channel, so two identical requests racing must not
-- both expand (with preferences changing in between they could choose different channels). The
-- second waits here, then finds the first one's rows. Sorted keys: no deadlock between batches.
SELECT count(pg_advisory_xact_lock(hashtextextended('nq-request:' || k, 0)))
FROM (SELECT DISTINCT k FROM unnest(%(keys)b::text[]) AS k ORDER BY k) keys

-- name: notification_get_by_keys
-- Through the keys table: its primary key, then each row by id in the queue or the log. The hash
-- of the request that made each row is the key's (0009): the rows' own column is not written
-- since 0.2.0. As stored (nq_stored_hash): its first 32 hex characters, compared with a
-- request's by services.validation.same_request.
WITH k AS (
    SELECT notification_id, nq_stored_hash(request_digest, request_hash) AS request_hash
    FROM nq_idempotency_keys
    WHERE key = ANY(%(idempotency_keys)b::text[])
)
SELECT {{_notification_columns}}, k.request_hash FROM nq_all_notifications n
JOIN k ON k.notification_id = n.id
WHERE n.id = ANY(ARRAY(SELECT notification_id FROM k))

-- name: notification_get
SELECT {{_notification_columns}} FROM nq_all_notifications n WHERE id = %(id)s

-- name: _notification_list_filters
-- The list's filters on a row `n` (notification_list's parts, its `waiting` forms).
(%(channel)s::text IS NULL OR n.channel = %(channel)s)
AND (%(recipient)s::text IS NULL OR n.recipient = %(recipient)s)
AND (%(recipient_id)s::text IS NULL OR n.recipient_id = %(recipient_id)s)
AND (%(after_created_at)s::timestamptz IS NULL
     OR (n.created_at, n.id) > (%(after_created_at)s::timestamptz, %(after_id)s::uuid))

-- name: notification_list
-- Keyset pagination, oldest first: (created_at, id) strictly after the cursor, so rows added
-- while a client pages (always newer) never shift a page: no gaps, no repeats.
-- Four parts, each the first %(limit)s of its own rows in that order, merged (docs/design.md,
-- "Reads"): PENDING rows through nq_jobs_pending_created; PROCESSING rows (the few in flight)
-- through nq_jobs_lease and a sort; finished rows, all of them or the SENT ones, through the
-- log's (created_at, id) index or the one that starts with the recipient filter; finished rows
-- of one other status through nq_delivery_log_unsent (status, created_at, id). The queue keeps
-- its order for PENDING rows only and the log its status index for the rows not SENT, so a
-- claim and a sent row's completion write no entry in them (0009, 0010). Not a query over
-- nq_all_notifications with the status split into its parts: a part of a UNION ALL with a WHERE
-- of its own is planned apart, for all its rows (a sort of the whole backlog), not for the first
-- rows of the merge. The part a status filter needs is chosen by conditions on the parameter
-- alone, so a plan kept for the statement never reads the others (tests/test_list_parts.py).
SELECT {{_notification_columns}} FROM (
    (SELECT {{_notification_columns}} FROM nq_jobs n
     WHERE n.status = 'PENDING' AND (%(status)s::text IS NULL OR %(status)s::text = 'PENDING')
       AND {{_notification_list_filters}}
     ORDER BY n.created_at, n.id
     LIMIT %(limit)s)
    UNION ALL
    (SELECT {{_notification_columns}} FROM nq_jobs n
     WHERE n.status = 'PROCESSING'
       AND (%(status)s::text IS NULL OR %(status)s::text = 'PROCESSING')
       AND {{_notification_list_filters}}
     ORDER BY n.created_at, n.id
     LIMIT %(limit)s)
    UNION ALL
    (SELECT {{_notification_columns}} FROM ({{_finished_notifications}}) n
     WHERE (%(status)s::text IS NULL OR %(status)s::text = 'SENT')
       AND (%(status)s::text IS NULL OR n.status = 'SENT')
       AND {{_notification_list_filters}}
     ORDER BY n.created_at, n.id
     LIMIT %(limit)s)
    UNION ALL
    (SELECT {{_notification_columns}} FROM ({{_finished_notifications}}) n
     WHERE %(status)s::text NOT IN ('PENDING', 'PROCESSING', 'SENT')
       AND n.status <> 'SENT' AND n.status = %(status)s
       AND {{_notification_list_filters}}
     ORDER BY n.created_at, n.id
     LIMIT %(limit)s)
) n
ORDER BY n.created_at, n.id
LIMIT %(limit)s

-- name: notification_list_unserved
-- notification_list for `?waiting=NoWorker`: PENDING rows that wait for a worker only (no reason,
-- or its until passed) in the lanes no live worker serves, `channel:rank` strings (the lanes come
-- from nq_workers, a table this statement does not join: on Citus it is the coordinator's alone).
-- A scan of the due part of the queue in those lanes; asked for by a person, rarely.
SELECT {{_notification_columns}} FROM nq_jobs n
WHERE n.status = 'PENDING'
  AND (n.waiting_reason IS NULL OR n.waiting_until <= now())
  AND n.channel || ':' || n.priority = ANY(%(lanes)s::text[])
  AND (%(status)s::text IS NULL OR n.status = %(status)s)
  AND {{_notification_list_filters}}
ORDER BY n.created_at, n.id
LIMIT %(limit)s

-- name: queue_status_unserved
-- The `NoWorker` count of notify_queue_waiting: PENDING rows that wait for a worker only in the
-- lanes no live worker serves (as notification_list_unserved). Read only when a lane is
-- unserved; its cost follows that lane's due backlog.
SELECT count(*) AS n FROM nq_jobs
WHERE status = 'PENDING'
  AND (waiting_reason IS NULL OR waiting_until <= now())
  AND channel || ':' || priority = ANY(%(lanes)s::text[])

-- name: _finished_notifications
-- The log's rows with the columns only an unfinished row has, as nq_all_notifications gives them.
SELECT l.*, NULL::text AS waiting_reason, NULL::timestamptz AS waiting_until,
       NULL::text AS waiting_detail
FROM nq_delivery_log l

-- name: notification_list_waiting
-- notification_list for `?waiting=R`: only a PENDING row can wait, so only the queue is read,
-- never the log. The partial index nq_jobs_waiting (0009: PENDING rows with a reason, by reason
-- and until) finds the rows waiting for R now, as the API shows them (a row whose until has
-- passed is due: models.current_waiting); they are few (the backlog's deferred part) and sorted
-- here into the same keyset order as notification_list, with its other filters.
SELECT {{_notification_columns}} FROM nq_jobs n
WHERE n.status = 'PENDING'
  AND n.waiting_reason = %(waiting)s
  AND (n.waiting_until IS NULL OR n.waiting_until > now())
  AND (%(status)s::text IS NULL OR n.status = %(status)s)
  AND {{_notification_list_filters}}
ORDER BY n.created_at, n.id
LIMIT %(limit)s

-- name: notification_cancel
-- Cancel and claim race through the row lock: a claim holds it, so this waits for it and then
-- re-checks status = 'PENDING' on the newest row version; whichever commits first wins and the
-- other changes nothing. nq_finish_held moves the row to the log (the caller reads it back with
-- notification_get, a statement of its own that sees the move).
-- A digest's item is cancelled by digest_cancel_lock and digest_item_cancel instead (digests.sql:
-- the digest is locked first and its count and carrier kept), so it is not matched here.
WITH pending AS (
    SELECT id FROM nq_jobs
    WHERE id = %(id)s AND status = 'PENDING' AND digest_id IS NULL
    FOR UPDATE
)
SELECT f.id FROM nq_finish_held(ARRAY(SELECT id FROM pending), NULL,
                                ARRAY(SELECT 'CANCELLED' FROM pending),
                                NULL, NULL, NULL, NULL, NULL, %(default_webhook_url)s) AS f

-- name: notification_retry
-- Operator retry of one notification (nq_retry): only from FAILED or DEAD_LETTERED, and
-- only while its idempotency key is still its own; otherwise nothing. The caller reads it back.
SELECT nq_retry(ARRAY[%(id)s::uuid]) AS id

-- name: _retried_values
-- A log row back in the queue (nq_retry and its Citus form), in _moved_columns' order up to the
-- bucket: PENDING and due now, its attempts from zero, the retry and the status it left noted.
id, idempotency_key, request_hash, channel, recipient, subject, body, priority, 'PENDING',
send_at, now(), expires_at, 0, max_attempts, NULL, sent_at, provider_message_id, NULL, NULL,
retries || jsonb_build_array(jsonb_build_object(
    'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
    'fromStatus', status)),
source, policy, webhook_url, metadata, created_at, now(), NULL, recipient_id, category,
template_name, template_version, provider, delivery_attempts

-- name: notification_retry_batch
-- Operator retry of up to %(limit)s notifications in one status, oldest first (the log's status
-- index). SKIP LOCKED: two operators retrying at once split the work instead of waiting on each
-- other. Returns the count retried and how many remain, so the caller repeats until none remain.
-- Rows whose key retention already forgot (their partition is being dropped) are not
-- picked: nq_delivery_log_retry would refuse them, and as the oldest they would fill every batch.
WITH picked AS (
    -- Never SENT (nq_retry takes FAILED and DEAD_LETTERED only): through the status index of the
    -- rows not sent (0009), whose predicate this condition states.
    SELECT id FROM nq_delivery_log l
    WHERE status = %(status)s AND status <> 'SENT'
      AND EXISTS (SELECT 1 FROM nq_idempotency_keys k
                  WHERE k.key = l.idempotency_key AND k.notification_id = l.id)
    ORDER BY created_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), retried AS (
    SELECT id FROM nq_retry(ARRAY(SELECT id FROM picked)) AS r(id)
)
-- What remains: the counter of the status as this statement found it, less what it retried.
SELECT (SELECT count(*) FROM retried) AS retried,
       (SELECT COALESCE(sum(n), 0) FROM nq_counters WHERE name = 'notifications:' || %(status)s)
         - (SELECT count(*) FROM retried) AS remaining

-- name: notification_wake_workers
-- A hint, not a message: workers LISTEN on nq_wakeup and look for due work when one arrives.
-- Sent by a debounced waker (never one per row); a lost hint costs one poll interval. The
-- common create carries it inside its own statement instead (notification_enqueue_pending).
SELECT pg_notify('nq_wakeup', '')

-- name: queue_status_counts
-- Counts per status at a cost independent of history (0004_counters.sql): final states from the
-- counters the log's triggers keep (a few rows per status), PENDING and PROCESSING from the
-- queue's partial indexes (the claim and lease indexes hold only those rows).
SELECT split_part(name, ':', 2) AS status, sum(n)::bigint AS n
FROM nq_counters WHERE starts_with(name, 'notifications:') GROUP BY name
UNION ALL
SELECT 'PENDING', count(*) FROM nq_jobs WHERE status = 'PENDING'
UNION ALL
SELECT 'PROCESSING', count(*) FROM nq_jobs WHERE status = 'PROCESSING'

-- name: queue_status_due
-- PENDING and due now, per priority, with the oldest due time: reads only the claim index.
SELECT priority, count(*) AS n, min(next_attempt_at) AS oldest_due
FROM nq_jobs
WHERE status = 'PENDING' AND next_attempt_at <= now()
GROUP BY priority

-- name: queue_status_webhooks
-- Delivered and failed events from the counters; pending ones from the dispatch index.
SELECT split_part(name, ':', 2) AS state, sum(n)::bigint AS n
FROM nq_counters WHERE starts_with(name, 'webhooks:') GROUP BY name
UNION ALL
SELECT 'pending', count(*) FROM nq_webhook_events WHERE state = 'pending'

-- name: queue_status_waiting
-- PENDING rows per waiting reason, counting those whose reason still holds (until ahead, or not
-- known), as the API shows them. An index-only scan of the partial index nq_jobs_waiting (0009),
-- which holds only deferred PENDING rows: the cost follows what waits, never the history or
-- the due backlog.
SELECT waiting_reason AS reason, count(*) AS n
FROM nq_jobs
WHERE status = 'PENDING' AND waiting_reason IS NOT NULL
  AND (waiting_until IS NULL OR waiting_until > now())
GROUP BY waiting_reason

-- name: database_now
SELECT now() AS now

-- name: _insert_log_half
-- The end of the insert functions (functions/nq_insert_notifications.sql,
-- nq_insert_digest_items.sql) after their queue half `queued` over `accepted`: the rows born final
-- (SUPPRESSED) go to the log with their webhook events and counters; events and counted are read
-- (once, as init plans) so that they run.
), logged AS (
    INSERT INTO nq_delivery_log AS l (
        id, idempotency_key, request_hash, channel, recipient, subject, body, priority, status,
        send_at, next_attempt_at, expires_at, max_attempts, source, policy, webhook_url,
        metadata, last_error, finished_at, category, recipient_id, template_name,
        template_version, bucket, traceparent, tenant)
    SELECT a.id, a.idempotency_key, NULL, a.channel, a.recipient, a.subject, a.body,
           a.priority, a.status, a.send_at, a.next_attempt_at, a.expires_at, a.max_attempts,
           a.source, a.policy, a.webhook_url, a.metadata, a.last_error, a.finished_at,
           a.category, a.recipient_id, a.template_name, a.template_version, a.bucket,
           a.traceparent, a.tenant
    FROM accepted a WHERE a.status <> 'PENDING'
    RETURNING l.id, l.idempotency_key, l.request_hash, l.channel, l.recipient, l.subject,
              l.body, l.priority, l.status, l.send_at, l.next_attempt_at, l.expires_at,
              l.attempt_count, l.max_attempts, l.last_error, l.sent_at, l.provider_message_id,
              l.retries, l.source, l.policy, l.webhook_url, l.metadata, l.created_at,
              l.updated_at, l.finished_at, l.recipient_id, l.category, l.template_name,
              l.template_version, l.provider, l.delivery_attempts, l.bucket,
              NULL::text AS waiting_reason, NULL::timestamptz AS waiting_until,
              NULL::text AS waiting_detail, l.digest_id, l.escalation_id, l.traceparent
), events AS (
    SELECT nq_insert_webhook_events(array_agg(g.id), array_agg(g.status),
                                    array_agg(g.attempt_count), array_agg(g.webhook_url),
                                    array_agg(g.policy), p_default_webhook_url,
                                    NULL::text[], array_agg(g.bucket)) AS n
    FROM logged g
), counted AS (
    SELECT nq_note_changes(array_agg(g.id), array_agg(g.source), NULL, array_agg(g.status)) AS n
    FROM logged g
)
SELECT i.* FROM (SELECT * FROM queued UNION ALL SELECT * FROM logged) i
WHERE (SELECT n FROM events) IS NOT DISTINCT FROM (SELECT n FROM events)
  AND (SELECT n FROM counted) IS NOT DISTINCT FROM (SELECT n FROM counted)

-- name: _insert_request_columns
-- The insert functions' request items (json_to_recordset), the columns every create carries.
id uuid, idempotency_key text, request_hash text, channel text, recipient text,
subject text, body text, priority smallint, send_at timestamptz, expires_at timestamptz,
source text, policy text, webhook_url text, metadata jsonb, status text, last_error text,
category text, recipient_id text, template_name text, template_version integer,
traceparent text, position bigint, tenant text

-- name: _insert_keys_accepted
-- The insert functions' keys (a key seen before inserts nothing: its row is not accepted) and the
-- accepted rows with what the server decides (attempts from the policy, bucket, finished_at).
keys AS (
    INSERT INTO nq_idempotency_keys (key, notification_id, request_digest)
    SELECT r.idempotency_key, r.id, decode(left(r.request_hash, 32), 'hex') FROM request r
    ORDER BY r.position
    ON CONFLICT (key) DO NOTHING
    RETURNING notification_id
), accepted AS (
    SELECT r.id, r.idempotency_key, r.request_hash, r.channel, r.recipient, r.subject, r.body,
           r.priority, r.status, r.send_at, r.send_at AS next_attempt_at, r.expires_at,
           COALESCE(p.max_attempts, p_default_max_attempts) AS max_attempts, r.source,
           r.policy, r.webhook_url, r.metadata, r.last_error,
           CASE WHEN r.status <> 'PENDING' THEN now() END AS finished_at, r.category,
           r.recipient_id, r.template_name, r.template_version,
           nq_bucket(COALESCE(r.recipient_id, r.recipient)) AS bucket, r.traceparent,
           COALESCE(r.tenant, 'default') AS tenant

-- name: _insert_queued_log_half
-- The end of the insert functions: the queued rows' columns (the `queued` CTE's RETURNING, whose
-- rows every insert path answers), then the log half of the rows born final.
RETURNING n.id, n.idempotency_key, n.request_hash, n.channel, n.recipient, n.subject,
          n.body, n.priority, n.status, n.send_at, n.next_attempt_at, n.expires_at,
          n.attempt_count, n.max_attempts, n.last_error, n.sent_at, n.provider_message_id,
          n.retries, n.source, n.policy, n.webhook_url, n.metadata, n.created_at,
          n.updated_at, n.finished_at, n.recipient_id, n.category, n.template_name,
          n.template_version, n.provider, n.delivery_attempts, n.bucket, n.waiting_reason,
          n.waiting_until, n.waiting_detail, n.digest_id, n.escalation_id, n.traceparent
{{_insert_log_half}}

-- name: _insert_queued_columns
-- The queue's columns the insert functions write (the `queued` CTE's INSERT).
id, idempotency_key, request_hash, channel, recipient, subject, body, priority, status,
send_at, next_attempt_at, expires_at, max_attempts, source, policy, webhook_url,
metadata, last_error, finished_at, category, recipient_id, template_name,
template_version, bucket, traceparent, tenant, waiting_reason, waiting_until,
waiting_detail

-- name: _insert_signature
-- The arguments and result rows of the insert functions (nq_insert_notifications,
-- nq_insert_digest_items): the rows as created, every column the API answers with.
    p_items json, p_default_max_attempts integer, p_default_webhook_url text
) RETURNS TABLE (
    id uuid, idempotency_key text, request_hash text, channel text, recipient text,
    subject text, body text, priority smallint, status text, send_at timestamptz,
    next_attempt_at timestamptz, expires_at timestamptz, attempt_count integer,
    max_attempts integer, last_error text, sent_at timestamptz, provider_message_id text,
    retries jsonb, source text, policy text, webhook_url text, metadata jsonb,
    created_at timestamptz, updated_at timestamptz, finished_at timestamptz,
    recipient_id text, category text, template_name text, template_version integer,
    provider text, delivery_attempts jsonb, bucket smallint, waiting_reason text,
    waiting_until timestamptz, waiting_detail text, digest_id uuid, escalation_id uuid,
    traceparent text)
