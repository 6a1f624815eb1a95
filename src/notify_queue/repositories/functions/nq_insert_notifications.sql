-- The insert of every create path but the API's common batch: keys first (a key seen before
-- inserts nothing), rows, their log half (SUPPRESSED), events and counters.
CREATE OR REPLACE FUNCTION nq_insert_notifications(
{{_insert_signature}}
LANGUAGE sql VOLATILE AS $$
WITH request AS (
    SELECT * FROM json_to_recordset(p_items) AS r(
        id uuid, idempotency_key text, request_hash text, channel text, recipient text,
        subject text, body text, priority smallint, send_at timestamptz, expires_at timestamptz,
        source text, policy text, webhook_url text, metadata jsonb, status text, last_error text,
        category text, recipient_id text, template_name text, template_version integer,
        traceparent text, position bigint, tenant text)
), keys AS (
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
    FROM request r
    JOIN keys k ON k.notification_id = r.id
    LEFT JOIN nq_policies p ON p.name = r.policy
), queued AS (
    INSERT INTO nq_jobs AS n (
        id, idempotency_key, request_hash, channel, recipient, subject, body, priority, status,
        send_at, next_attempt_at, expires_at, max_attempts, source, policy, webhook_url,
        metadata, last_error, finished_at, category, recipient_id, template_name,
        template_version, bucket, traceparent, tenant, waiting_reason, waiting_until,
        waiting_detail)
    SELECT a.id, a.idempotency_key, NULL, a.channel, a.recipient, a.subject, a.body,
           a.priority, a.status, a.send_at, a.next_attempt_at, a.expires_at, a.max_attempts,
           a.source, a.policy, a.webhook_url, a.metadata, a.last_error, a.finished_at,
           a.category, a.recipient_id, a.template_name, a.template_version, a.bucket,
           a.traceparent, a.tenant,
           CASE WHEN a.send_at > now() THEN 'Scheduled' END,
           CASE WHEN a.send_at > now() THEN a.send_at END,
           CASE WHEN a.send_at > now() THEN 'sendAt is in the future' END
    FROM accepted a WHERE a.status = 'PENDING'
    RETURNING n.id, n.idempotency_key, n.request_hash, n.channel, n.recipient, n.subject,
              n.body, n.priority, n.status, n.send_at, n.next_attempt_at, n.expires_at,
              n.attempt_count, n.max_attempts, n.last_error, n.sent_at, n.provider_message_id,
              n.retries, n.source, n.policy, n.webhook_url, n.metadata, n.created_at,
              n.updated_at, n.finished_at, n.recipient_id, n.category, n.template_name,
              n.template_version, n.provider, n.delivery_attempts, n.bucket, n.waiting_reason,
              n.waiting_until, n.waiting_detail, n.digest_id, n.escalation_id, n.traceparent
{{_insert_log_half}}
$$;
