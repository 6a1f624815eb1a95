-- Statements for a Citus coordinator only (docs/scaling.md "Citus: every role"). Each
-- is the plain-PostgreSQL statement of the same name without `_bucket`/`_citus` (delivery.sql,
-- webhooks.sql, notifications.sql), reshaped for what Citus 14 runs; a rule both shapes share is a
-- fragment of the plain file (`{{_name}}`). The Citus driver (engine_citus.py) runs these, the
-- plain one (engine_postgresql.py) never does; a statement Citus accepts unchanged is not here.
-- The rules that shape them:
-- - FOR UPDATE [SKIP LOCKED] runs only in a router query: every distributed table the statement
--   locks or writes is named with `bucket = %(bucket)s`, and the caller runs it once per bucket,
--   the buckets found first by a lock-free multi-shard look (`*_buckets` below).
-- - A simple `CASE x WHEN 'a'` inside an UPDATE's SET is deparsed by Citus as `WHEN NULL::boolean`
--   (the shard then refuses `text = boolean`): the searched form `CASE WHEN x = 'a'` is used.
-- - A FOR UPDATE CTE read by a later CTE of the same router statement comes back from the worker
--   node in a copy format the reader does not expect (`invalid input syntax ... "PGCOPY"`): the
--   rate windows are therefore locked by their UPDATE itself, not first by a sorted SELECT. Two
--   statements that give back places of the same recipients in opposite orders can deadlock; the
--   node that holds the bucket detects it, one statement fails and its caller repeats it (the
--   completer and housekeeping retry a failed batch).
-- - No non-IMMUTABLE function inside CASE or COALESCE in a multi-shard UPDATE's SET: the values
--   are computed first, in a CTE the coordinator evaluates.
-- - The drain's per-bucket steps (the claim, the completion, lease recovery) and every move into
--   the log (citus_finish) are functions delegated to the node that holds the bucket
--   (citus/functions.sql, whose header says what their bodies may do); these statements call
--   them. What a node cannot write (the status outbox, the Kubernetes links and the NOTIFY the
--   operator LISTENs for: coordinator tables; a reference table's rows) comes back from the
--   function and is written by citus_status_outbox_queue / citus_push_tokens_gone on the
--   coordinator in the caller's transaction.
-- - nq_note_changes (the counters and the outbox) must run on the coordinator: a statement whose
--   every distributed table names one bucket is sent to that shard's node WHOLE, functions
--   included (EXPLAIN: one Task, the Function Scan on the worker node). So a statement that
--   would be sent whole locks by bucket and returns ids, and the caller runs citus_finish or
--   citus_note_changes in the same transaction.

-- name: citus_finish
-- The move into the log (its webhook events, counters) of rows a router statement of the same
-- transaction locked in one bucket: nq_finish_bucket (citus/functions.sql), delegated to the
-- bucket's node. The caller writes the Kubernetes rows' changes to the outbox
-- (citus_status_outbox_queue), on the coordinator, in the same transaction.
SELECT id, status, old_status, source
FROM nq_finish_bucket(%(bucket)s::smallint, %(ids)b::uuid[], %(statuses)b::text[],
                      %(last_errors)b::text[], NULL::integer[], NULL::text[], NULL::text[],
                      NULL::jsonb[], %(default_webhook_url)s::text)

-- name: citus_note_changes
-- nq_note_changes on the coordinator for rows a router statement of this transaction changed.
SELECT nq_note_changes(%(ids)b::uuid[], %(sources)b::text[], %(old_statuses)b::text[],
                       %(new_statuses)b::text[]) AS noted

-- name: citus_job_buckets
-- The bucket of each unfinished notification among the ids: a lock-free multi-shard read (one
-- probe of each shard's index on id), so a statement that locks them can route per bucket.
SELECT bucket, array_agg(id) AS ids FROM nq_jobs WHERE id = ANY(%(ids)b::uuid[]) GROUP BY bucket
ORDER BY bucket

-- name: citus_log_buckets
-- The same for finished notifications (the log), for a retry.
SELECT bucket, array_agg(id) AS ids FROM nq_delivery_log WHERE id = ANY(%(ids)b::uuid[])
GROUP BY bucket ORDER BY bucket

-- name: claim_lock_candidates_bucket
-- A claim's first step in one bucket: nq_claim_lock_bucket_v2 (citus/functions.sql), delegated
-- whole to the node holding the bucket and run there on its shards (claim_lock_candidates' locks
-- by aged priority up to the visit's rank, the quiet-hours facts, the candidates' digests locked
-- SKIP LOCKED).
SELECT ids, quiet_ids, quiet_priorities, quiet_categories, quiet_timezones, quiet_starts,
       quiet_ends, digest_ids
FROM nq_claim_lock_bucket_v2(%(bucket)s::smallint, %(priorities)b::smallint[],
                             %(channels)b::text[], %(limit)s::integer,
                             %(aging_seconds)s::float8, %(max_rank)s::smallint)

-- name: claim_admit_candidates_bucket
-- A claim's second step in one bucket, in the same transaction: nq_claim_admit_bucket_v2
-- (claim_admit_candidates' decisions), delegated to the bucket's node; rows in claim order, each
-- with the Kubernetes rows' changes for citus_status_outbox_queue and its address's suppression
-- reason.
SELECT * FROM nq_claim_admit_bucket_v2(
    %(bucket)s::smallint, %(ids)b::uuid[], %(claim_token)s::uuid, %(rate_limit)s::integer,
    %(rate_window_seconds)s::float8, %(lease_seconds)s::float8,
    %(backoff_base_seconds)s::float8, %(backoff_max_seconds)s::float8,
    %(chain_channels)b::text[], %(chain_heads)b::text[], %(known_providers)b::text[],
    %(quiet_ids)b::uuid[], %(digest_ids)b::uuid[], %(webhook_url)s::text)

-- name: complete_deliveries_bucket
-- complete_deliveries for one bucket's results: nq_complete_bucket (citus/functions.sql),
-- delegated whole to the node holding the bucket (one call, its statements local there). Returns
-- the ids accepted, the Kubernetes rows' changes (citus_status_outbox_queue) and the push tokens
-- gone (citus_push_tokens_gone), which the caller writes on the coordinator in the same
-- transaction.
SELECT accepted_ids, kube_ids, kube_old_statuses, kube_new_statuses, gone_recipient_ids,
       gone_tokens
FROM nq_complete_bucket(
    %(bucket)s::smallint, %(ids)b::uuid[], %(claim_tokens)b::uuid[], %(statuses)b::text[],
    %(retry_in_seconds)b::float8[], %(last_errors)b::text[], %(provider_message_ids)b::text[],
    %(providers)b::text[], %(attempts)s::jsonb, %(give_back)b::bool[],
    %(next_attempt_ats)b::timestamptz[], %(addresses_gone)b::bool[],
    %(bound_providers)b::text[], %(waiting_reasons)b::text[], %(waiting_details)b::text[],
    %(default_webhook_url)s::text)

-- name: citus_status_outbox_queue
-- The status writes of Kubernetes objects' rows a delegated function changed (it returns them:
-- the outbox and the links are coordinator tables, and the operator LISTENs here), in the
-- caller's transaction; nq_note_changes' outbox part.
WITH queued AS (
    INSERT INTO nq_status_outbox (uid, namespace, name, notification_id, old_status, new_status)
    SELECT l.uid, l.namespace, l.name, c.id, c.old_status, c.new_status
    FROM unnest(%(ids)b::uuid[], %(old_statuses)b::text[], %(new_statuses)b::text[])
         AS c(id, old_status, new_status)
    JOIN nq_kube_links l ON l.notification_id = c.id
    RETURNING 1
)
SELECT count(*) AS queued,
       CASE WHEN count(*) > 0 THEN pg_notify('nq_status_outbox', '') END AS notified
FROM queued

-- name: citus_push_tokens_gone
-- The push tokens a provider said are gone, out of their recipients (a reference table: written
-- by the coordinator, not by the delegated completion), in the completion's transaction.
UPDATE nq_recipients rc
SET push_tokens = ARRAY(SELECT t FROM unnest(rc.push_tokens) t WHERE t <> ALL(g.tokens)),
    updated_at = now()
FROM (SELECT g.recipient_id, array_agg(g.token) AS tokens
      FROM unnest(%(recipient_ids)b::text[], %(tokens)b::text[]) AS g(recipient_id, token)
      GROUP BY g.recipient_id) g
WHERE rc.id = g.recipient_id

-- name: release_claims_bucket
-- release_claims within one bucket (see complete_deliveries_bucket for the window's lock).
WITH released AS (
    UPDATE nq_jobs n
    {{_claim_released}}
    FROM unnest(%(ids)b::uuid[], %(claim_tokens)b::uuid[]) AS r(id, claim_token)
    WHERE n.bucket = %(bucket)s AND n.id = ANY(%(ids)b::uuid[]) AND n.id = r.id AND n.claim_token = r.claim_token
      AND n.status = 'PROCESSING'
    RETURNING n.id, n.source, n.bucket, n.recipient
), given_back AS (
    SELECT bucket, recipient, array_agg(id) AS ids FROM released GROUP BY bucket, recipient
), windows AS (
    UPDATE nq_rate_windows w
    {{_window_give_back}}
    FROM given_back g
    WHERE w.bucket = %(bucket)s
      AND w.bucket = g.bucket AND w.recipient = g.recipient
)
-- The Kubernetes objects' rows are noted by the caller (citus_note_changes): this statement is
-- sent whole to the bucket's node (see the top of this file).
SELECT count(*) AS released,
       COALESCE(array_agg(id) FILTER (WHERE source = 'kubernetes'), '{}') AS kubernetes_ids
FROM released

-- name: lease_expired_buckets
-- The buckets with a lease that ran out, most overdue first (lock-free, multi-shard; the lease
-- index of each shard). recover_expired_leases_bucket then recovers each one's.
SELECT bucket FROM nq_jobs
WHERE status = 'PROCESSING' AND lease_expires_at < now()
GROUP BY bucket ORDER BY min(lease_expires_at) LIMIT %(limit)s

-- name: recover_expired_leases_bucket
-- recover_expired_leases within one bucket: nq_recover_expired_leases_bucket
-- (citus/functions.sql), delegated to the bucket's node; the caller writes the Kubernetes rows'
-- changes to the outbox in the same transaction (citus_status_outbox_queue).
SELECT recovered, dead_lettered, kube_ids, kube_old_statuses, kube_new_statuses
FROM nq_recover_expired_leases_bucket(%(bucket)s::smallint, %(limit)s::integer,
                                      %(default_webhook_url)s::text)

-- name: overdue_buckets
-- The buckets with a PENDING notification whose expiresAt passed (lock-free, multi-shard).
SELECT bucket FROM nq_jobs
WHERE status = 'PENDING' AND expires_at IS NOT NULL AND expires_at <= now()
GROUP BY bucket ORDER BY min(expires_at) LIMIT %(limit)s

-- name: expire_overdue_bucket
-- expire_overdue within one bucket: the overdue rows locked (a router statement); the caller
-- moves them with citus_finish in the same transaction (see the top of this file).
SELECT id, COALESCE(last_error, 'expired before it could be sent') AS last_error FROM nq_jobs
WHERE bucket = %(bucket)s AND status = 'PENDING' AND expires_at IS NOT NULL AND expires_at <= now()
ORDER BY expires_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: prune_rate_windows_citus
-- prune_rate_windows without the locking subquery (FOR UPDATE SKIP LOCKED needs one shard, and a
-- multi-shard DELETE takes no LIMIT): a multi-shard DELETE of the windows nothing counts any more.
-- A window a claim is writing is recent: the DELETE waits for that claim's row lock, re-checks
-- last_taken_at on the new version and leaves it. The cutoff is computed first (a CTE the
-- coordinator evaluates), so each shard compares with a constant.
WITH cutoff AS (
    SELECT now() - make_interval(secs => GREATEST(
        %(default_window_seconds)s,
        (SELECT COALESCE(max({{_policy_longest_window}}), 0) FROM nq_policies p))) AS t
)
DELETE FROM nq_rate_windows
WHERE last_taken_at < (SELECT t FROM cutoff)

-- name: webhook_due_buckets
-- The buckets of the most urgent due webhook events (lock-free, multi-shard), with how many of
-- those events each holds; webhook_claim_due_bucket then claims that many from each.
SELECT bucket, count(*) AS n
FROM (SELECT bucket, next_attempt_at FROM nq_webhook_events
      WHERE state = 'pending' AND next_attempt_at <= now()
      ORDER BY next_attempt_at LIMIT %(limit)s) d
GROUP BY bucket ORDER BY min(next_attempt_at)

-- name: webhook_claim_due_bucket
-- webhook_claim_due within one bucket (its rules are the fragments of webhooks.sql).
WITH due AS (
    SELECT id, attempts FROM nq_webhook_events
    WHERE bucket = %(bucket)s AND {{_webhook_due}}
),
spent AS (
    UPDATE nq_webhook_events e
    {{_webhook_spent_set}}
    WHERE e.bucket = %(bucket)s
      AND e.id = ANY(ARRAY(SELECT id FROM due WHERE attempts >= %(max_attempts)s))
    RETURNING e.state
), claimed AS (
    UPDATE nq_webhook_events e
    {{_webhook_claim_set}}
    WHERE e.bucket = %(bucket)s
      AND e.id = ANY(ARRAY(SELECT id FROM due WHERE attempts < %(max_attempts)s))
    {{_webhook_claimed_returning}}
), {{_webhook_claim_answer}}

-- name: notification_cancel_bucket
-- notification_cancel's lock with the row's bucket (citus_job_buckets), so it routes; the caller
-- moves the row with citus_finish in the same transaction (see the top of this file).
-- A digest's item is left to digest_cancel_lock and digest_item_cancel (digests.sql).
SELECT id FROM nq_jobs
WHERE bucket = %(bucket)s AND id = %(id)s AND status = 'PENDING' AND digest_id IS NULL
FOR UPDATE

-- name: delivery_log_forget_keys_unlocked
-- Retention on Citus: delivery_log_forget_keys without the lock on the partition's rows.
SELECT nq_delivery_log_forget_keys_unlocked(%(partition)s, %(after)s, %(limit)s) AS last_id

-- name: delivery_log_detach_citus
-- Retention on Citus, which refuses DETACH ... CONCURRENTLY: a plain DETACH. It takes an ACCESS
-- EXCLUSIVE lock on the log (and on each shard of it) for the moment it runs, so completions and
-- reads of the log wait that moment once a day.
ALTER TABLE nq_delivery_log DETACH PARTITION {partition}

-- name: notification_retry_lock_bucket
-- Retry on Citus, step 1 of 3 (nq_retry, in steps Citus can route): lock the rows to
-- retry in their bucket of the log, only from FAILED or DEAD_LETTERED.
SELECT l.id, l.idempotency_key FROM nq_delivery_log l
WHERE l.bucket = %(bucket)s AND l.id = ANY(%(ids)b::uuid[])
  AND l.status IN ('FAILED', 'DEAD_LETTERED')
ORDER BY l.id
FOR UPDATE

-- name: notification_retry_lock_key
-- Step 2: the row's key, still its own (retention has not forgotten it), held against retention
-- for this transaction (a router statement: the keys are distributed by key). No row: not
-- retried.
SELECT k.notification_id AS id FROM nq_idempotency_keys k
WHERE k.key = %(key)s AND k.notification_id = %(id)s
FOR KEY SHARE

-- name: notification_retry_move_bucket
-- Step 3: the locked rows move from the log back to the queue, PENDING with a fresh set of
-- attempts and the retry recorded (as nq_retry); the DELETE names the bucket (router), the
-- INSERT reads its rows through the coordinator.
WITH moved AS (
    DELETE FROM nq_delivery_log
    WHERE bucket = %(bucket)s AND id = ANY(%(ids)b::uuid[]) AND status IN ('FAILED', 'DEAD_LETTERED')
    RETURNING id, idempotency_key, request_hash, channel, recipient, subject, body, priority,
              status, send_at, expires_at, max_attempts, sent_at, provider_message_id, retries,
              source, policy, webhook_url, metadata, created_at, recipient_id, category,
              template_name, template_version, provider, delivery_attempts, bucket, digest_id,
              escalation_id, traceparent, tenant
), queued AS (
    INSERT INTO nq_jobs ({{_moved_columns}})
    SELECT {{_retried_values}}, bucket, digest_id, escalation_id, traceparent, tenant
    FROM moved
    RETURNING id
), noted AS (
    SELECT nq_note_changes(array_agg(m.id), array_agg(m.source), array_agg(m.status),
                           array_fill('PENDING'::text, ARRAY[count(*)::integer])) AS n
    FROM moved m
)
SELECT q.id FROM queued q WHERE (SELECT n FROM noted) IS NOT DISTINCT FROM (SELECT n FROM noted)

-- name: notification_retry_pick
-- The operator's batch retry on Citus: the oldest rows in %(status)s, without locks (the lock is
-- taken per row by the steps above, and a row another retry moved first is skipped there).
-- Never SENT: through the status index of the rows not sent (0009), whose predicate is stated.
SELECT id FROM nq_delivery_log WHERE status = %(status)s AND status <> 'SENT'
ORDER BY created_at, id LIMIT %(limit)s

-- name: notification_status_count
-- How many notifications are in a final status (the counters, as notification_retry_batch).
SELECT COALESCE(sum(n), 0) AS n FROM nq_counters WHERE name = 'notifications:' || %(status)s

-- name: digest_cancel_lock_bucket
-- digest_cancel_lock (digests.sql) with the item's bucket (citus_job_buckets): the digest's lock
-- names its bucket, so it routes (a digest lives on its items' shard, citus/layout.sql).
SELECT d.bucket, d.id, d.state FROM nq_digests d
WHERE d.bucket = %(bucket)s
  AND d.id = (SELECT j.digest_id FROM nq_jobs j
              WHERE j.bucket = %(bucket)s AND j.id = %(id)s AND j.status = 'PENDING'
                AND j.digest_id IS NOT NULL)
FOR UPDATE OF d

-- name: digest_item_cancel_bucket
-- digest_item_cancel (digests.sql) on Citus, after digest_cancel_lock_bucket: the item locked
-- by bucket; the caller moves it with citus_finish (CANCELLED, its webhook event) and then runs
-- digest_item_leave_bucket, in the same transaction. Separate statements because Citus sends a
-- statement whose every table names one bucket to that shard's node whole, functions with it
-- (see the top of this file).
SELECT id FROM nq_jobs
WHERE bucket = %(bucket)s AND id = %(id)s AND status = 'PENDING' AND digest_id = %(digest_id)s
FOR UPDATE

-- name: digest_item_leave_bucket
-- Second statement, run only when the first cancelled the item (same transaction, the digest
-- still locked): the item leaves its digest by digest_item_cancel's rules (the fragments of
-- digests.sql), in one router statement.
WITH {{_digest_leave_successor}}, left_digest AS (
    UPDATE nq_digests d
    {{_digest_leave_set}}
    WHERE d.bucket = %(bucket)s AND d.id = %(digest_id)s
    RETURNING d.closes_at, d.state
), {{_digest_leave_handed}}
SELECT (SELECT count(*) FROM handed) AS handed

-- name: escalation_buckets
-- The bucket of an escalation known by id (lock-free, multi-shard: one probe of each shard's
-- nq_escalations_id), so the acknowledgement's locks route to its shard. An escalation's bucket
-- never changes (its recipient's), so what is read here is what the lock finds.
SELECT bucket FROM nq_escalations WHERE id = %(id)s

-- name: escalation_acknowledge_lock_bucket
-- escalation_acknowledge_lock (escalations.sql) with the bucket: a router FOR UPDATE.
SELECT bucket, id, step_ids, acknowledged_at FROM nq_escalations
WHERE bucket = %(bucket)s AND id = %(id)s
FOR UPDATE

-- name: escalation_steps_stop_bucket
-- escalation_steps_stop with the bucket (an escalation's steps live on its shard: their bucket
-- is the recipient's, as the escalation's): the PENDING steps locked; the caller moves them
-- with citus_finish (CANCELLED, 'acknowledged') in the same transaction, as
-- notification_cancel_bucket (see the top of this file).
SELECT id FROM nq_jobs
WHERE bucket = %(bucket)s AND id = ANY(%(ids)b::uuid[]) AND status = 'PENDING'
ORDER BY id FOR UPDATE

-- The operator's statements (operator.sql) on Citus. The Kubernetes links and the status outbox
-- are plain tables on the coordinator there (citus/layout.sql): a FOR UPDATE on them is a local
-- lock again, and the outbox rows nq_note_changes writes with every change of an object's row are
-- a local insert in the change's transaction (not a write on every node, as a reference table's).
-- What Citus cannot plan is a lock on them in a statement that also reads a distributed table, or
-- an outer join from them to one (it pulls the whole distributed side to the coordinator): the
-- notification is read by a second statement, by id.

-- name: kube_link_bucket_citus
-- The bucket of the row an object is linked to (lock-free, multi-shard: one probe of each shard's
-- id index, in the queue and the log). A row's bucket never changes (its recipient's), so the
-- lock kube_link_lock_*_bucket takes with it finds the same row. None: no such row.
SELECT bucket FROM nq_all_notifications WHERE id = %(notification_id)s LIMIT 1

-- name: kube_link_save_citus
-- kube_link_save's link, alone, committed before the row's status is read (the caller's second
-- transaction: kube_link_lock_*_bucket, then kube_link_status_queue_citus). A change of the row
-- whose nq_note_changes runs after this commit finds the link and queues its own status write.
-- One whose note ran before this commit changed the row before it too, so it held the row's lock
-- since then, and the FOR SHARE that follows waits for its commit and reads what it wrote. No
-- change slips between the two (plain PostgreSQL gets the same from one statement, whose row lock
-- comes first; on Citus whether the worker node releases that lock before the coordinator's
-- local commit is visible depends on how Citus commits: one phase or two).
INSERT INTO nq_kube_links (uid, namespace, name, notification_id, generation)
VALUES (%(uid)s, %(namespace)s, %(name)s, %(notification_id)s, %(generation)s)
ON CONFLICT (uid) DO UPDATE SET generation = excluded.generation

-- name: kube_link_lock_queued_bucket
-- The linked row in the queue, FOR SHARE with its bucket (a router lock): waits for a change in
-- flight to commit and reads its status. No row: it is final (moved to the log, perhaps while
-- this waited), and kube_link_lock_logged_bucket, a new statement, finds it there.
SELECT status FROM nq_jobs
WHERE bucket = %(bucket)s AND id = %(notification_id)s
FOR SHARE

-- name: kube_link_lock_logged_bucket
-- The linked row in the log, FOR SHARE with its bucket: only a retry changes it there (under the
-- same lock).
SELECT status FROM nq_delivery_log
WHERE bucket = %(bucket)s AND id = %(notification_id)s
FOR SHARE

-- name: kube_link_status_queue_citus
-- kube_link_save's first status write for the object, with the status the lock above read, and
-- the writer's wake-up (a local insert on the coordinator, where the operator LISTENs).
WITH queued AS (
    INSERT INTO nq_status_outbox (uid, namespace, name, notification_id, old_status, new_status)
    SELECT l.uid, l.namespace, l.name, l.notification_id, NULL, %(status)s
    FROM nq_kube_links l
    WHERE l.uid = %(uid)s AND l.notification_id = %(notification_id)s
    RETURNING seq
)
SELECT (SELECT count(*) FROM queued) AS queued, pg_notify('nq_status_outbox', '') AS notified

-- name: status_outbox_take_citus
-- status_outbox_take's objects and their queued rows, coalesced the same way, from the outbox and
-- the links alone (plain tables on the coordinator). The rows' state is read next by
-- status_outbox_notifications_citus, by id: joined here, Citus would pull every row of the queue
-- and the log to the coordinator to answer the outer join.
WITH {{_status_outbox_changed}}
SELECT c.uid AS object_uid, c.namespace AS object_namespace, c.name AS object_name,
       c.notification_id AS object_notification_id, c.outbox_seqs, c.entered_statuses,
       l.uid IS NOT NULL AS object_linked, l.generation AS object_generation
FROM changed c
LEFT JOIN nq_kube_links l ON l.uid = c.uid
ORDER BY c.first_seq

-- name: status_outbox_notifications_citus
-- The current state of a batch's rows (status_outbox_take_citus), by id in the queue and the log
-- (one probe of each shard's id index), and whether each row's policy exists and is Ready (a
-- reference table, joined on the row's shard).
SELECT COALESCE(p.ready, true) AS object_policy_ready, p.name IS NOT NULL AS object_policy_exists,
       {{_notification_columns}}
FROM nq_all_notifications n
LEFT JOIN nq_policies p ON p.name = n.policy
WHERE n.id = ANY(%(ids)b::uuid[])

-- name: status_outbox_related_citus
-- status_outbox_take's related_ids for the rows of recipientId requests (one row per channel,
-- keys "<key> <channel>"): the keys to look for, then the keys (distributed by key,
-- one probe each), each step a CTE the coordinator evaluates (the correlated subquery of the
-- plain statement is refused beside a CTE).
WITH wanted AS MATERIALIZED (
    SELECT r.id, split_part(r.idempotency_key, ' ', 1) || ' ' || suffix AS key
    FROM unnest(%(ids)b::uuid[], %(idempotency_keys)b::text[]) AS r(id, idempotency_key)
    CROSS JOIN unnest(ARRAY['email', 'sms', 'push', 'suppressed']) AS suffix
), found AS MATERIALIZED (
    SELECT key, notification_id, created_at FROM nq_idempotency_keys
    WHERE key = ANY(ARRAY(SELECT key FROM wanted))
)
SELECT w.id, array_agg(f.notification_id ORDER BY f.created_at, f.notification_id) AS related_ids
FROM wanted w JOIN found f USING (key)
GROUP BY w.id

-- name: kube_finished_take_due_citus
-- kube_finished_take_due without FOR UPDATE ... SKIP LOCKED, which Citus refuses beside the
-- distributed notifications: the due links are read lock-free (the links go to each shard as an
-- intermediate result, joined with its rows by id), then marked by an UPDATE of the local table
-- that repeats the due test on the mark. Of two replicas taking the same link, the second waits
-- for the first's row lock, finds the mark and skips it: they still split the work, the second
-- after a wait instead of at once.
WITH due AS (
    {{_kube_finished_due}}
)
UPDATE nq_kube_links l SET ttl_delete_requested_at = now()
FROM due
WHERE l.uid = due.uid
  AND (l.ttl_delete_requested_at IS NULL OR l.ttl_delete_requested_at < now() - interval '1 minute')
RETURNING l.uid, l.namespace, l.name, l.notification_id, l.generation, 0::bigint AS other_links

-- name: _kube_requeued
-- PL/pgSQL of the delegated functions (citus/functions.sql): a row `t` put back to PENDING from
-- PROCESSING (a retried result, a recovered lease), noted for its object's status write when it
-- is a Kubernetes object's.
IF t.source = 'kubernetes' THEN
    kube_ids := kube_ids || t.id;
    kube_old_statuses := kube_old_statuses || 'PROCESSING'::text;
    kube_new_statuses := kube_new_statuses || 'PENDING'::text;
END IF;
