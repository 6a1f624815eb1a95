-- A webhook event's body (docs/webhooks.md): the notification's final status as a receiver reads
-- it, stamped when the event is written. Both engines' event inserts call it.
CREATE OR REPLACE FUNCTION nq_webhook_payload(
    p_event_id uuid, p_id uuid, p_status text, p_attempt_count integer, p_provider text
) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
RETURN json_build_object(
    'eventId', p_event_id, 'jobId', p_id, 'status', p_status, 'attemptCount', p_attempt_count,
    'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
    'provider', p_provider
)::text;
