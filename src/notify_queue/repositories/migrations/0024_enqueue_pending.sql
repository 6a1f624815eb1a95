-- The API path's PostgreSQL cost per create (docs/performance.md), expand step: one new function,
-- nothing replaced. 0.2.0's statements keep calling nq_insert_notifications (0016), unchanged.
--
-- nq_enqueue_pending is nq_insert_notifications for the API's common batch: every row PENDING,
-- no digest's item (the caller sends those to the full function). A statement of ~16-32
-- coalesced single creates paid, besides its rows, a fixed cost that a batch of 1,000 spreads
-- thin (about 1 ms of server CPU per statement on the benchmark's machine):
--
-- - the log's half of the full function: an INSERT into the partitioned log with no row, and the
--   webhook-event and counter calls (nq_insert_webhook_events, nq_note_changes and its counter
--   statements) run with empty arrays. A PENDING row has no event and is not counted (the queue's
--   partial indexes count PENDING), so this function has no log half;
-- - the wake-up as a statement of its own after the INSERT: here `pg_notify` runs in the same
--   statement, when the caller asks (`p_wake`: the API's debounced waker decided a wake-up is due
--   now) and a row was inserted; PostgreSQL sends it at commit, so a rolled-back insert wakes
--   nobody;
-- - every column of the row returned: the API builds its answer from the request it validated
--   and the columns the server decides, which are what this returns (the row's id, its
--   max_attempts from the policy, created_at/updated_at, the waiting fields from the database's
--   clock) plus metadata as jsonb stores it (key order and numbers normalised, as a read shows).
--
-- The steps and their reasons are nq_insert_notifications's (notification_insert_many's comment
-- in repositories/sql/notifications.sql): keys first ON CONFLICT DO NOTHING, so a key that
-- existed inserts no row and the caller reads the existing one; max_attempts fixed now from the
-- policy. A SQL function with a quoted body, as 0016's: on Citus it is planned statement by
-- statement on the coordinator, and PostgreSQL 18 keeps its plan for the session.
CREATE FUNCTION nq_enqueue_pending(
    p_items json, p_default_max_attempts integer, p_wake boolean
) RETURNS TABLE (
    id uuid, max_attempts integer, created_at timestamptz, updated_at timestamptz,
    waiting_reason text, waiting_until timestamptz, waiting_detail text, metadata jsonb)
LANGUAGE sql VOLATILE AS $$
WITH request AS (
    SELECT * FROM json_to_recordset(p_items) AS r(
        id uuid, idempotency_key text, request_hash text, channel text, recipient text,
        subject text, body text, priority smallint, send_at timestamptz, expires_at timestamptz,
        source text, policy text, webhook_url text, metadata jsonb, category text,
        recipient_id text, template_name text, template_version integer, traceparent text,
        position bigint)
), keys AS (
    INSERT INTO nq_idempotency_keys (key, notification_id, request_hash)
    SELECT r.idempotency_key, r.id, r.request_hash FROM request r ORDER BY r.position
    ON CONFLICT (key) DO NOTHING
    RETURNING notification_id
), queued AS (
    INSERT INTO nq_jobs AS n (
        id, idempotency_key, request_hash, channel, recipient, subject, body, priority, status,
        send_at, next_attempt_at, expires_at, max_attempts, source, policy, webhook_url,
        metadata, category, recipient_id, template_name, template_version, bucket, traceparent,
        waiting_reason, waiting_until, waiting_detail)
    SELECT r.id, r.idempotency_key, r.request_hash, r.channel, r.recipient, r.subject, r.body,
           r.priority, 'PENDING', r.send_at, r.send_at, r.expires_at,
           COALESCE(p.max_attempts, p_default_max_attempts), r.source, r.policy,
           r.webhook_url, r.metadata, r.category, r.recipient_id, r.template_name,
           r.template_version, nq_bucket(COALESCE(r.recipient_id, r.recipient)), r.traceparent,
           CASE WHEN r.send_at > now() THEN 'Scheduled' END,
           CASE WHEN r.send_at > now() THEN r.send_at END,
           CASE WHEN r.send_at > now() THEN 'sendAt is in the future' END
    FROM request r
    JOIN keys k ON k.notification_id = r.id
    LEFT JOIN nq_policies p ON p.name = r.policy
    RETURNING n.id, n.max_attempts, n.created_at, n.updated_at, n.waiting_reason,
              n.waiting_until, n.waiting_detail, n.metadata
), woken AS (
    -- A hint, not a message (notification_wake_workers); one per statement at most, and only
    -- when it inserted a row: a statement of existing keys only wakes nobody. Counted, not
    -- selected: Citus keeps a CTE's rows as an intermediate result, which cannot hold a void.
    SELECT count(*) AS sent FROM pg_notify('nq_wakeup', '')
    WHERE p_wake AND EXISTS (SELECT FROM queued)
)
-- woken is read (once, as an init plan) so that it runs.
SELECT q.* FROM queued q WHERE (SELECT sent FROM woken) >= 0
$$;
