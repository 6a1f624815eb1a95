-- The notifications' view with the tenant of 0085 and 0086, in a step of its own (0085).

-- Every notification with its tenant: the column added at the end (CREATE OR REPLACE keeps the
-- others as they are; the previous release names the columns it reads).
DO $$
BEGIN
    EXECUTE $view$
CREATE OR REPLACE VIEW nq_all_notifications AS
SELECT id, idempotency_key, request_hash, channel, recipient, subject, body, priority, status,
       send_at, next_attempt_at, expires_at, attempt_count, max_attempts, last_error, sent_at,
       provider_message_id, retries, source, policy, webhook_url, metadata, created_at,
       updated_at, finished_at, recipient_id, category, template_name, template_version, provider,
       delivery_attempts, bucket, waiting_reason, waiting_until, waiting_detail, digest_id,
       escalation_id, traceparent, claim_token, lease_expires_at, tenant
FROM nq_jobs
UNION ALL
SELECT id, idempotency_key, request_hash, channel, recipient, subject, body, priority, status,
       send_at, next_attempt_at, expires_at, attempt_count, max_attempts, last_error, sent_at,
       provider_message_id, retries, source, policy, webhook_url, metadata, created_at,
       updated_at, finished_at, recipient_id, category, template_name, template_version, provider,
       delivery_attempts, bucket, NULL, NULL, NULL, digest_id, escalation_id, traceparent, NULL,
       NULL, tenant
FROM nq_delivery_log
$view$;
END $$;
