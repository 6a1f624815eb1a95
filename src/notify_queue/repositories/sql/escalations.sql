-- Escalations (docs/escalation.md): the create, the read and the
-- acknowledgement. Lock order, everywhere: the escalation row first, then its steps' queue rows.
-- The worker never locks an escalation row: its claim reads the row's state from its snapshot
-- (nq_claim: "ESCALATION GUARD"), which is what makes the order safe.

-- name: escalation_insert
-- An escalation and its steps in one statement: the steps' idempotency keys first (ON CONFLICT
-- DO NOTHING, as nq_insert_notifications), then the escalation row only when every key was new,
-- then one queue row per step. The caller holds the request key's advisory lock and has looked
-- the keys up, so a key taken meanwhile (a plain create naming "<key> step2") leaves fewer rows
-- than steps: the caller then rolls the transaction back. A step's send time is the database's
-- now() plus its afterSeconds, and a later step waits with reason EscalationStep in this same
-- insert (write-ahead, as every waiting reason). Steps are never born final: the recipient's
-- opt-outs and quiet hours are checked at each step's send time, by the claim.
WITH request AS (
    SELECT * FROM json_to_recordset(%(items)s::json) AS r(
        id uuid, idempotency_key text, request_hash text, channel text, recipient text,
        subject text, body text, priority smallint, after_seconds integer,
        expires_at timestamptz, source text, policy text, webhook_url text, metadata jsonb,
        category text, recipient_id text, template_name text, template_version integer,
        traceparent text, waiting_detail text, position bigint)
), keys AS (
    INSERT INTO nq_idempotency_keys (key, notification_id, request_hash)
    SELECT r.idempotency_key, r.id, r.request_hash FROM request r ORDER BY r.position
    ON CONFLICT (key) DO NOTHING
    RETURNING notification_id
), escalation AS (
    INSERT INTO nq_escalations (bucket, id, recipient_id, idempotency_key, step_ids, steps)
    SELECT nq_bucket(%(recipient_id)s), %(id)s, %(recipient_id)s, %(idempotency_key)s,
           ARRAY(SELECT r.id FROM request r ORDER BY r.position), %(steps)s::jsonb
    WHERE (SELECT count(*) FROM keys) = (SELECT count(*) FROM request)
    RETURNING id
), timed AS (
    SELECT r.*, now() + make_interval(secs => r.after_seconds) AS send_at FROM request r
)
INSERT INTO nq_jobs AS n (
    id, idempotency_key, channel, recipient, subject, body, priority, status,
    send_at, next_attempt_at, expires_at, max_attempts, source, policy, webhook_url, metadata,
    category, recipient_id, template_name, template_version, bucket, traceparent, escalation_id,
    waiting_reason, waiting_until, waiting_detail)
SELECT r.id, r.idempotency_key, r.channel, r.recipient, r.subject, r.body,
       r.priority, 'PENDING', r.send_at, r.send_at, r.expires_at,
       COALESCE(p.max_attempts, %(default_max_attempts)s), r.source, r.policy, r.webhook_url,
       r.metadata, r.category, r.recipient_id, r.template_name, r.template_version,
       nq_bucket(r.recipient_id), r.traceparent, e.id,
       CASE WHEN r.after_seconds > 0 THEN 'EscalationStep' END,
       CASE WHEN r.after_seconds > 0 THEN r.send_at END,
       CASE WHEN r.after_seconds > 0 THEN r.waiting_detail END
FROM timed r
CROSS JOIN escalation e
LEFT JOIN nq_policies p ON p.name = r.policy
ORDER BY r.position
RETURNING {{_notification_columns}}

-- name: escalation_get
-- An escalation with its steps in step order (the queue's or the log's rows, by primary key).
-- The state is read here: acknowledged once acknowledged_at is set; exhausted when no step is
-- in the queue any more (every one final) without an acknowledgement; else active.
SELECT e.id AS escalation, e.recipient_id AS escalation_recipient_id,
       e.acknowledged_at AS escalation_acknowledged_at,
       e.acknowledged_by AS escalation_acknowledged_by,
       e.created_at AS escalation_created_at,
       CASE WHEN e.acknowledged_at IS NOT NULL THEN 'acknowledged'
            WHEN EXISTS (SELECT 1 FROM nq_jobs j
                         WHERE j.bucket = e.bucket AND j.id = ANY(e.step_ids)) THEN 'active'
            ELSE 'exhausted' END AS escalation_state,
       {{_notification_columns}}
FROM nq_escalations e
CROSS JOIN LATERAL unnest(e.step_ids) WITH ORDINALITY AS s(id, position)
JOIN nq_all_notifications n ON n.bucket = e.bucket AND n.id = s.id
WHERE e.id = %(id)s
ORDER BY s.position

-- name: escalation_acknowledge_lock
-- Step 1 of an acknowledgement (one transaction): the escalation row, locked. Two
-- acknowledgements queue here; the second then finds acknowledged_at set and changes nothing.
SELECT bucket, id, step_ids, acknowledged_at FROM nq_escalations WHERE id = %(id)s FOR UPDATE

-- name: escalation_acknowledge_mark
-- Step 2: the state, written once. From its commit on, every claim of a step reads it (the
-- guard in nq_claim) and cancels the step instead of handing it out.
UPDATE nq_escalations SET acknowledged_at = now(), acknowledged_by = %(by)s
WHERE bucket = %(bucket)s AND id = %(id)s AND acknowledged_at IS NULL

-- name: escalation_steps_stop
-- Step 3: every step still PENDING becomes CANCELLED with lastError `acknowledged`, through
-- nq_finish_held (the move to the log, counters, the operator's status write). FOR UPDATE, not SKIP
-- LOCKED: a step a claim holds right now is waited for, then re-checked on its new version; a
-- claim that won it saw the escalation active (it never waits for this transaction), so the
-- step was due before this acknowledgement commits and may go (docs/escalation.md). Rows in id
-- order: two statements that lock several steps never deadlock.
WITH pending AS (
    SELECT id FROM nq_jobs WHERE id = ANY(%(ids)b::uuid[]) AND status = 'PENDING'
    ORDER BY id FOR UPDATE
)
SELECT f.id FROM nq_finish_held(ARRAY(SELECT id FROM pending), NULL,
                                ARRAY(SELECT 'CANCELLED' FROM pending),
                                ARRAY(SELECT 'acknowledged' FROM pending),
                                NULL, NULL, NULL, NULL, %(default_webhook_url)s) AS f

-- name: escalation_note_objects
-- Step 4, for steps mirrored from a Notification object: queue a status write for the object
-- (its status.escalation shows the new state) even when its linked step did not change (sent
-- already). From and to are the same status, so no counter moves.
SELECT nq_note_changes(array_agg(n.id), array_agg(n.source), array_agg(n.status),
                       array_agg(n.status)) AS queued
FROM nq_all_notifications n
WHERE n.id = ANY(%(ids)b::uuid[]) AND n.source = 'kubernetes'
