-- Delivery policies, mirrored from NotificationPolicy resources by the operator.

-- name: policy_upsert
INSERT INTO nq_policies (name, rate_limit, rate_window_seconds, max_attempts, backoff_base_seconds,
                         backoff_max_seconds, webhook_url, webhook_secrets, ttl_seconds_after_finished)
VALUES (%(name)s, %(rate_limit)s, %(rate_window_seconds)s, %(max_attempts)s, %(backoff_base_seconds)s,
        %(backoff_max_seconds)s, %(webhook_url)s, %(webhook_secrets)s, %(ttl_seconds_after_finished)s)
ON CONFLICT (name) DO UPDATE SET
    rate_limit = excluded.rate_limit,
    rate_window_seconds = excluded.rate_window_seconds,
    max_attempts = excluded.max_attempts,
    backoff_base_seconds = excluded.backoff_base_seconds,
    backoff_max_seconds = excluded.backoff_max_seconds,
    webhook_url = excluded.webhook_url,
    webhook_secrets = excluded.webhook_secrets,
    ttl_seconds_after_finished = excluded.ttl_seconds_after_finished,
    updated_at = now()

-- name: policy_delete
DELETE FROM nq_policies WHERE name = %(name)s

-- name: policy_get
SELECT * FROM nq_policies WHERE name = %(name)s
