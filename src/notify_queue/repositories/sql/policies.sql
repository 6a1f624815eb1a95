-- Delivery policies, mirrored from NotificationPolicy resources by the operator.

-- name: policy_upsert
-- Store a policy as mirrored. `ready` false (its Secret is missing, its spec unusable) holds the
-- notifications that name it (migration 0006): policies fail closed. Returns whether readiness
-- changed, so the operator refreshes the statuses of the notifications the policy holds or lets
-- go only then. `before` and the upsert run on one snapshot, so `before` is the old row.
WITH before AS (
    SELECT ready FROM nq_policies WHERE name = %(name)s
), upserted AS (
    INSERT INTO nq_policies (name, rate_limit, rate_window_seconds, max_attempts,
                             backoff_base_seconds, backoff_max_seconds, webhook_url,
                             webhook_secrets, ttl_seconds_after_finished, ready)
    VALUES (%(name)s, %(rate_limit)s, %(rate_window_seconds)s, %(max_attempts)s,
            %(backoff_base_seconds)s, %(backoff_max_seconds)s, %(webhook_url)s,
            %(webhook_secrets)s, %(ttl_seconds_after_finished)s, %(ready)s)
    ON CONFLICT (name) DO UPDATE SET
        rate_limit = excluded.rate_limit,
        rate_window_seconds = excluded.rate_window_seconds,
        max_attempts = excluded.max_attempts,
        backoff_base_seconds = excluded.backoff_base_seconds,
        backoff_max_seconds = excluded.backoff_max_seconds,
        webhook_url = excluded.webhook_url,
        webhook_secrets = excluded.webhook_secrets,
        ttl_seconds_after_finished = excluded.ttl_seconds_after_finished,
        ready = excluded.ready,
        updated_at = now()
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
    JOIN nq_notifications n ON n.id = l.notification_id
    WHERE l.namespace = %(namespace)s AND n.policy = %(name)s AND n.status = 'PENDING'
    RETURNING seq
)
SELECT count(*) AS queued,
       CASE WHEN count(*) > 0 THEN pg_notify('nq_status_outbox', '') END AS notified
FROM queued

-- name: policy_delete
DELETE FROM nq_policies WHERE name = %(name)s

-- name: policy_get
SELECT * FROM nq_policies WHERE name = %(name)s
