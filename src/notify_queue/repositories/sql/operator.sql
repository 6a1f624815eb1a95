-- The Kubernetes operator's queries: links between Notification objects and rows, the status
-- outbox that carries row changes back to the objects, the TTL sweep and lane depths for scaling.
-- Every query that takes a namespace treats NULL as "all namespaces" (a cluster-wide operator).

-- name: kube_link_get
-- The row a Notification object became, and how many other objects share that row (the same
-- explicit idempotencyKey and request): a shared row is cancelled only with its last object.
SELECT l.uid, l.namespace, l.name, l.notification_id, l.generation,
       (SELECT count(*) FROM nq_kube_links o
        WHERE o.notification_id = l.notification_id AND o.uid <> l.uid) AS other_links
FROM nq_kube_links l
WHERE l.uid = %(uid)s

-- name: kube_link_save
-- Link an object to its row and queue its first status write, in one statement.
-- The row is locked FOR SHARE first. A worker's UPDATE of the row that started before this
-- link existed fired the outbox trigger without finding the link; the lock waits for that
-- worker to commit, so the status this statement queues is read after the change and cannot be
-- older than it. Conversely a worker that updates after this commits finds the link (each
-- statement of the trigger function takes a fresh snapshot). No change slips between the two.
-- Repeating it (an operator restart, a second replica) queues one more, harmless, status write.
-- The row is in the queue or in the log (0008). A row the worker's commit just moved to the log
-- is gone from the queue when the lock is granted, and this statement's snapshot predates its
-- log row: then nothing is linked (`linked` is 0) and the caller runs the statement again,
-- which finds the row in the log, final, where nothing changes it any more but a retry (which
-- takes the same row lock to move it back).
WITH queued_row AS (
    SELECT id, status FROM nq_jobs WHERE id = %(notification_id)s FOR SHARE
), logged_row AS (
    SELECT id, status FROM nq_delivery_log WHERE id = %(notification_id)s FOR SHARE
), target AS (
    SELECT * FROM queued_row UNION ALL SELECT * FROM logged_row
), link AS (
    INSERT INTO nq_kube_links (uid, namespace, name, notification_id, generation)
    SELECT %(uid)s, %(namespace)s, %(name)s, t.id, %(generation)s FROM target t
    ON CONFLICT (uid) DO UPDATE SET generation = excluded.generation
    RETURNING uid, namespace, name, notification_id
), queued AS (
    INSERT INTO nq_status_outbox (uid, namespace, name, notification_id, old_status, new_status)
    SELECT l.uid, l.namespace, l.name, l.notification_id, NULL, t.status
    FROM link l JOIN target t ON t.id = l.notification_id
    RETURNING seq
)
SELECT (SELECT count(*) FROM queued) AS queued, pg_notify('nq_status_outbox', '') AS notified

-- name: kube_link_uids
-- The uids of the objects linked in a scope: the operator compares them at start with the objects
-- the API server lists, to clean up after those deleted while it was not running.
SELECT uid FROM nq_kube_links
WHERE (%(namespace)s::text IS NULL OR namespace = %(namespace)s::text)

-- name: kube_link_delete
-- The object is gone (its DELETED event, or found gone): forget the link. The row stays, as history; outbox
-- rows still queued for the object are dropped by the writer when it finds no link.
DELETE FROM nq_kube_links WHERE uid = %(uid)s

-- name: status_outbox_lock
-- One status writer at a time per scope (namespace or cluster), across operator replicas: a
-- transaction-level advisory lock, taken without waiting, released at commit. Batches are so
-- serialised, and each reads the rows' current state, so a slower writer can never overwrite a
-- newer status with an older one. The key is a hash of "nq status outbox" and the scope.
SELECT pg_try_advisory_xact_lock(
    hashtextextended('nq status outbox:' || COALESCE(%(namespace)s::text, '*'), 0)) AS locked

-- name: status_outbox_take
-- The objects with the oldest queued changes (up to %(limit)s objects), each with ALL its queued
-- rows, coalesced: one result per object with every seq it covers, the statuses it entered (for
-- Events), and the row's current state, read now, which is what the object's status will show.
-- Taking whole objects rather than the oldest rows means that under a backlog an object whose
-- row went PENDING -> PROCESSING -> SENT gets one patch (SENT), not three.
-- Runs in the writer's transaction after status_outbox_lock; the rows are deleted in that
-- transaction once their patches succeeded. The outbox holds only what is not yet written
-- back (a backlog of thousands at worst), so grouping it whole is cheap.
WITH {{_status_outbox_changed}}
SELECT c.uid AS object_uid, c.namespace AS object_namespace, c.name AS object_name,
       c.outbox_seqs, c.entered_statuses,
       l.uid IS NOT NULL AS object_linked, l.generation AS object_generation,
       -- A recipientId request became one row per channel, with keys "<key> <channel>" (issue
       -- 12): the object links to the first and lists them all in status.notifications. Found
       -- through the idempotency keys (their primary key), only for such rows.
       CASE WHEN n.recipient_id IS NOT NULL THEN ARRAY(
           SELECT k.notification_id FROM nq_idempotency_keys k
           WHERE k.key = ANY(ARRAY(
               SELECT split_part(n.idempotency_key, ' ', 1) || ' ' || suffix
               FROM unnest(ARRAY['email', 'sms', 'push', 'suppressed']) AS suffix))
           ORDER BY k.created_at, k.notification_id) END AS related_ids,
       -- A row held by a policy that is not Ready shows Reconciling/PolicyNotReady; one whose
       -- policy does not exist (the defaults apply) says so in its Accepted condition.
       COALESCE(p.ready, true) AS object_policy_ready, p.name IS NOT NULL AS object_policy_exists,
       {{_notification_columns}}
FROM changed c
LEFT JOIN nq_kube_links l ON l.uid = c.uid
LEFT JOIN nq_all_notifications n ON n.id = c.notification_id
LEFT JOIN nq_policies p ON p.name = n.policy
ORDER BY c.first_seq

-- name: kube_escalation_states
-- The escalations of a batch's objects (spec.escalation), for status.escalation: their state as
-- escalation_get reads it (acknowledged once acknowledged_at is set, exhausted when no step is
-- in the queue any more) and their steps in order (status.notifications). By (bucket, id), the
-- bucket of the recipient like the steps', so on Citus each is read on its steps' shard.
SELECT e.id, e.step_ids,
       CASE WHEN e.acknowledged_at IS NOT NULL THEN 'acknowledged'
            WHEN EXISTS (SELECT 1 FROM nq_jobs j
                         WHERE j.bucket = e.bucket AND j.id = ANY(e.step_ids)) THEN 'active'
            ELSE 'exhausted' END AS state
FROM nq_escalations e
JOIN unnest(%(recipient_ids)s::text[], %(ids)s::uuid[]) AS k(recipient_id, id)
  ON e.bucket = nq_bucket(k.recipient_id) AND e.id = k.id

-- name: status_outbox_delete
-- Written back (or nothing left to write to): these changes are done.
DELETE FROM nq_status_outbox WHERE seq = ANY(%(seqs)b::bigint[])

-- name: status_outbox_lag
-- How far the write-back is behind: queued rows and the age of the oldest (a metric).
SELECT count(*) AS queued,
       COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8 AS oldest_age_seconds
FROM nq_status_outbox
WHERE %(namespace)s::text IS NULL OR namespace = %(namespace)s

-- name: kube_finished_take_due
-- Objects whose notification finished at least their policy's ttlSecondsAfterFinished ago,
-- marked as asked-to-delete in the same statement (asked again after a minute if the object is
-- still there, e.g. the delete call failed). Walks the links (one per object: thousands, not
-- millions) and reads each row by primary key. SKIP LOCKED: two replicas split the work.
WITH due AS (
    {{_kube_finished_due}}
    FOR UPDATE OF l SKIP LOCKED
)
UPDATE nq_kube_links l SET ttl_delete_requested_at = now()
FROM due WHERE l.uid = due.uid
RETURNING l.uid, l.namespace, l.name, l.notification_id, l.generation, 0::bigint AS other_links

-- name: kube_finished_next_due
-- Seconds until the next finished object's TTL runs out (negative: overdue), or NULL: none, so
-- the sweeper sleeps exactly that long instead of polling.
SELECT EXTRACT(EPOCH FROM min(n.finished_at + make_interval(secs => p.ttl_seconds_after_finished))
               - now())::float8 AS seconds
{{_kube_links_finished}}
  AND l.ttl_delete_requested_at IS NULL

-- name: lane_depths
-- Per lane (priority by channel): notifications a worker of that lane could claim now (PENDING,
-- due, not expired: expired rows are expire_overdue's and no worker delivers them) and the age
-- of the oldest. The scaler sums the lanes a pool drains; the same figures are the operator's
-- lane metrics, for an HPA (external metrics) or KEDA's prometheus scaler. The due range of the
-- partial claim index (status = 'PENDING', next_attempt_at) is all this reads.
SELECT priority, channel, count(*) AS depth,
       EXTRACT(EPOCH FROM now() - min(next_attempt_at))::float8 AS oldest_due_age_seconds
FROM nq_jobs
WHERE status = 'PENDING' AND next_attempt_at <= now()
  AND (expires_at IS NULL OR expires_at > now())
GROUP BY priority, channel

-- name: _status_outbox_changed
-- The outbox's objects with the oldest queued changes (up to %(limit)s objects, in one namespace or
-- all) and, per object and row, every seq queued and the statuses it entered: status_outbox_take
-- and its Citus form read the rows' state beside it.
objects AS (
    SELECT uid, min(seq) AS first_seq
    FROM nq_status_outbox
    WHERE %(namespace)s::text IS NULL OR namespace = %(namespace)s
    GROUP BY uid
    ORDER BY first_seq
    LIMIT %(limit)s
), changed AS (
    SELECT o.uid, o.namespace, o.name, o.notification_id,
           array_agg(o.seq ORDER BY o.seq) AS outbox_seqs,
           min(o.seq) AS first_seq,
           COALESCE(array_agg(DISTINCT o.new_status) FILTER (
               WHERE o.old_status IS NOT NULL AND o.old_status IS DISTINCT FROM o.new_status), '{}')
               AS entered_statuses
    FROM nq_status_outbox o
    JOIN objects USING (uid)
    GROUP BY o.uid, o.namespace, o.name, o.notification_id
)

-- name: _kube_links_finished
-- The links (in one namespace or all) whose notification finished under a policy with a
-- ttlSecondsAfterFinished (`l`, `n`, `p`), for the sweeper's reads.
FROM nq_kube_links l
JOIN nq_all_notifications n ON n.id = l.notification_id
JOIN nq_policies p ON p.name = n.policy
WHERE (%(namespace)s::text IS NULL OR l.namespace = %(namespace)s)
  AND n.finished_at IS NOT NULL
  AND p.ttl_seconds_after_finished IS NOT NULL

-- name: _kube_finished_due
-- The links whose notification finished at least its policy's ttlSecondsAfterFinished ago and
-- that were not asked to delete in the last minute, oldest finished first, up to %(limit)s:
-- kube_finished_take_due locks them, its Citus form marks them without a lock.
    SELECT l.uid
    {{_kube_links_finished}}
      AND n.finished_at + make_interval(secs => p.ttl_seconds_after_finished) <= now()
      AND (l.ttl_delete_requested_at IS NULL OR l.ttl_delete_requested_at < now() - interval '1 minute')
    ORDER BY n.finished_at
    LIMIT %(limit)s

-- name: waiting_refresh_next
-- When the next Kubernetes notification's waiting reason runs out (its `until`), and the
-- database's now: the refresher sleeps until then (operator/refresh.py). Rows with a reason only,
-- the partial index nq_jobs_waiting (0009).
SELECT (SELECT min(waiting_until) FROM nq_jobs
        WHERE status = 'PENDING' AND waiting_reason IS NOT NULL AND source = 'kubernetes'
          AND waiting_until > now()) AS next_until,
       now() AS now

-- name: waiting_refresh_passed
-- Kubernetes notifications whose waiting reason ran out in (after, upto]: their status still
-- shows it. A read of the partial index nq_jobs_waiting (0009: deferred PENDING rows only), so
-- the cost follows what waits, never the due backlog. Ids only: the links are the coordinator's
-- own table, joined by waiting_refresh_queue.
SELECT id FROM nq_jobs
WHERE status = 'PENDING' AND waiting_reason IS NOT NULL AND source = 'kubernetes'
  AND waiting_until > %(after)s AND waiting_until <= %(upto)s

-- name: waiting_refresh_lanes
-- Kubernetes notifications that wait for a worker only (no reason, or it ran out) in the lanes
-- whose service by live workers just changed (`channel:rank`): they show `NoWorker`, or stop
-- showing it. Run only when a worker started or stopped; a scan of the queue's PENDING rows.
SELECT id FROM nq_jobs
WHERE status = 'PENDING' AND source = 'kubernetes'
  AND (waiting_reason IS NULL OR waiting_until <= now())
  AND channel || ':' || priority = ANY(%(lanes)s::text[])

-- name: waiting_refresh_queue
-- A status write for each object linked to these notifications (in this operator's namespace),
-- as the status trigger queues one for a change of the row (0003); the writer is poked in-process.
WITH queued AS (
    INSERT INTO nq_status_outbox (uid, namespace, name, notification_id, old_status, new_status)
    SELECT l.uid, l.namespace, l.name, l.notification_id, 'PENDING', 'PENDING'
    FROM nq_kube_links l
    WHERE l.notification_id = ANY(%(ids)s::uuid[])
      AND (%(namespace)s::text IS NULL OR l.namespace = %(namespace)s)
    RETURNING seq
)
SELECT count(*) AS queued FROM queued
