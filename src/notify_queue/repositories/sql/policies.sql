-- Delivery policies, mirrored from NotificationPolicy resources by the operator.

-- name: policy_upsert
-- Store a policy as mirrored. `ready` false (its Secret is missing, its spec unusable) holds the
-- notifications that name it (migration 0006): policies fail closed. Returns whether readiness
-- changed, so the operator refreshes the statuses of the notifications the policy holds or lets
-- go only then. `before` and the upsert run on one snapshot, so `before` is the old row.
WITH before AS (
    SELECT ready FROM nq_policies WHERE name = %(name)s
), upserted AS (
    INSERT INTO nq_policies (name, rate_limit, rate_window_seconds, channel_rate_limits,
                             max_attempts,
                             backoff_base_seconds, backoff_max_seconds, webhook_url,
                             webhook_secrets, ttl_seconds_after_finished, ready, failover,
                             providers, updated_at)
    -- now() in VALUES, taken from `excluded` below: Citus refuses a non-IMMUTABLE function in
    -- DO UPDATE SET (policies are a reference table); the same time on plain PostgreSQL.
    VALUES (%(name)s, %(rate_limit)s, %(rate_window_seconds)s, %(channel_rate_limits)s::jsonb,
            %(max_attempts)s,
            %(backoff_base_seconds)s, %(backoff_max_seconds)s, %(webhook_url)s,
            %(webhook_secrets)s, %(ttl_seconds_after_finished)s, %(ready)s, %(failover)s,
            %(providers)s, now())
    ON CONFLICT (name) DO UPDATE SET
        rate_limit = excluded.rate_limit,
        rate_window_seconds = excluded.rate_window_seconds,
        channel_rate_limits = excluded.channel_rate_limits,
        max_attempts = excluded.max_attempts,
        backoff_base_seconds = excluded.backoff_base_seconds,
        backoff_max_seconds = excluded.backoff_max_seconds,
        webhook_url = excluded.webhook_url,
        webhook_secrets = excluded.webhook_secrets,
        ttl_seconds_after_finished = excluded.ttl_seconds_after_finished,
        ready = excluded.ready,
        failover = excluded.failover,
        providers = excluded.providers,
        updated_at = excluded.updated_at
    RETURNING ready
)
SELECT (SELECT ready FROM before) IS DISTINCT FROM (SELECT ready FROM upserted) AS ready_changed

-- name: policy_refresh_statuses
-- Queue a status write for every PENDING notification of a Notification object that names this
-- policy (Reconciling: PolicyNotReady appears or goes). Walks the links of the policy's namespace
-- (objects, thousands) and reads each row by primary key; a wake-up for the status writer.
WITH queued AS (
    INSERT INTO nq_status_outbox (uid, namespace, name, notification_id, old_status, new_status)
    SELECT l.uid, l.namespace, l.name, n.id, n.status, n.status
    FROM nq_kube_links l
    JOIN nq_jobs n ON n.id = l.notification_id
    WHERE l.namespace = %(namespace)s AND n.policy = %(name)s AND n.status = 'PENDING'
    RETURNING seq
)
SELECT count(*) AS queued,
       CASE WHEN count(*) > 0 THEN pg_notify('nq_status_outbox', '') END AS notified
FROM queued

-- name: policy_release_held
-- The policy is Ready again: make its held notifications due now instead of at their next
-- recheck (up to 30 s away). Held rows are PENDING with no attempt used, their send time passed
-- and next_attempt_at in the future; the only other rows like that are rate-limited ones, and
-- making those due only costs one claim that defers them again (the claim re-checks the window).
-- A row with attempts made keeps its backoff. There is no index on policy: the claim index
-- (partial, PENDING, by priority and next_attempt_at) narrows it to the next 31 s of each lane,
-- which is where the claim puts held rows.
WITH released AS (
    UPDATE nq_jobs
    SET next_attempt_at = now(), updated_at = now(),
        waiting_reason = NULL, waiting_until = NULL, waiting_detail = NULL
    WHERE id IN (
        SELECT n.id
        FROM unnest('{0,1,2}'::smallint[]) AS lane(priority)
        CROSS JOIN LATERAL (
            SELECT id, policy, attempt_count, send_at FROM nq_jobs
            WHERE status = 'PENDING' AND priority = lane.priority
              AND next_attempt_at > now() AND next_attempt_at <= now() + interval '31 seconds'
        ) n
        WHERE n.policy = %(name)s AND n.attempt_count = 0 AND n.send_at <= now()
    )
    RETURNING id, source
)
-- The status writes of Notification objects among them (their due time changed), and a wake-up
-- for the workers (delivered at commit): an idle worker waits for it, it does not poll.
SELECT count(*) AS released,
       (SELECT nq_note_changes(array_agg(id), array_agg(source), array_agg('PENDING'::text),
                               array_agg('PENDING'::text))
        FROM released WHERE source = 'kubernetes') AS noted,
       CASE WHEN count(*) > 0 THEN pg_notify('nq_wakeup', '') END AS woken
FROM released

-- name: policy_delete
DELETE FROM nq_policies WHERE name = %(name)s

-- name: policy_get
SELECT * FROM nq_policies WHERE name = %(name)s
