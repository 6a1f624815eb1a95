-- The insert of every create path but the API's common batch: keys first (a key seen before
-- inserts nothing), rows, their log half (SUPPRESSED), events and counters.
CREATE OR REPLACE FUNCTION nq_insert_notifications(
{{_insert_signature}}
LANGUAGE sql VOLATILE AS $$
WITH request AS (
    SELECT * FROM json_to_recordset(p_items) AS r(
        {{_insert_request_columns}})
), {{_insert_keys_accepted}}
    FROM request r
    JOIN keys k ON k.notification_id = r.id
    LEFT JOIN nq_policies p ON p.name = r.policy
), queued AS (
    INSERT INTO nq_jobs AS n (
        {{_insert_queued_columns}})
    SELECT a.id, a.idempotency_key, NULL, a.channel, a.recipient, a.subject, a.body,
           a.priority, a.status, a.send_at, a.next_attempt_at, a.expires_at, a.max_attempts,
           a.source, a.policy, a.webhook_url, a.metadata, a.last_error, a.finished_at,
           a.category, a.recipient_id, a.template_name, a.template_version, a.bucket,
           a.traceparent, a.tenant,
           CASE WHEN a.send_at > now() THEN 'Scheduled' END,
           CASE WHEN a.send_at > now() THEN a.send_at END,
           CASE WHEN a.send_at > now() THEN 'sendAt is in the future' END
    FROM accepted a WHERE a.status = 'PENDING'
{{_insert_queued_log_half}}
$$;
