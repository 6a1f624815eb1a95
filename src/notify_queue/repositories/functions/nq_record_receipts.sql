-- Delivery receipts, verified by the caller (docs/receipts.md), in one statement: each event is
-- matched to the SENT notification with its provider and provider message id;
-- its receipt is stored when it says more than the one stored (a repeat changes nothing); a
-- permanent bounce or a complaint puts the address on the suppression list; and each changed
-- receipt gets its webhook event ("type": "delivery") and, for a Notification object, its status
-- write-back, all in the caller's one transaction.
-- p_events: a JSON array of {provider, providerMessageId, state, permanent, reason, at}: the
-- receipts of every request that arrived together (services/receipts.py coalesces them).
-- Returns one row per event: its state, whether a notification matched, whether it changed.

CREATE OR REPLACE FUNCTION nq_record_receipts(
    p_events jsonb, p_default_webhook_url text
) RETURNS TABLE (state text, matched boolean, changed boolean)
-- PL/pgSQL, not SQL: its body is not parsed where the function is made, so Citus can copy it to
-- worker nodes, which lack the coordinator's tables it names (nq_status_outbox, nq_kube_links).
LANGUAGE plpgsql VOLATILE
-- The CTEs have no statistics: joined to each other by a nested loop, a batch of a thousand
-- receipts took a quarter of a second (quadratic); hash joins keep it linear. The joins to
-- tables still probe their indexes where nothing else is possible.
SET enable_nestloop = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH e AS (
        SELECT x.ord, x.ev->>'provider' AS provider, x.ev->>'providerMessageId' AS message_id,
               x.ev->>'state' AS state,
               x.ev->>'state' = 'complained' OR COALESCE((x.ev->>'permanent')::boolean, false)
                   AS permanent,
               left(x.ev->>'reason', 1000) AS reason,
               COALESCE((x.ev->>'at')::timestamptz, now()) AS at
        FROM jsonb_array_elements(p_events) WITH ORDINALITY AS x(ev, ord)
    ), found AS (
        -- nq_delivery_log_provider_message, probed with the batch's ids as one array: a join
        -- on the JSON's rows alone was planned as a hash join over every partition's rows.
        SELECT e.*, l.id, l.channel, l.recipient, l.webhook_url, l.policy, l.bucket, l.tenant
        FROM e JOIN nq_delivery_log l
          ON l.provider_message_id = e.message_id AND l.provider = e.provider
        WHERE l.provider_message_id = ANY(ARRAY(SELECT message_id FROM e))
    ), strongest AS (
        -- Of several events for one notification in a batch, the one that says the most.
        SELECT DISTINCT ON (f.id) f.*
        FROM found f ORDER BY f.id, nq_receipt_rank(f.state, f.permanent) DESC, f.ord
    ), stored AS (
        INSERT INTO nq_delivery_receipts AS d
               (notification_id, provider, state, at, reason, permanent)
        SELECT s.id, s.provider, s.state, s.at, s.reason, s.permanent FROM strongest s
        -- received_at from the proposed row (its default, now()): Citus takes only IMMUTABLE
        -- functions in DO UPDATE SET on its tables.
        ON CONFLICT (notification_id) DO UPDATE
            SET state = excluded.state, at = excluded.at, reason = excluded.reason,
                permanent = excluded.permanent, received_at = excluded.received_at
            WHERE nq_receipt_rank(d.state, d.permanent)
                  < nq_receipt_rank(excluded.state, excluded.permanent)
        RETURNING d.notification_id
    ), changed AS (
        SELECT s.* FROM strongest s JOIN stored ON stored.notification_id = s.id
    ), suppressed AS (
        INSERT INTO nq_suppressions (tenant, channel, address, reason, at, notification_id)
        SELECT c.tenant, c.channel, nq_normalised_address(c.channel, c.recipient),
               CASE WHEN c.state = 'complained' THEN 'complained' ELSE 'bounced' END, c.at, c.id
        FROM changed c WHERE c.permanent
        ON CONFLICT DO NOTHING
        RETURNING 1
    ), events AS (
        INSERT INTO nq_webhook_events (id, notification_id, url, policy, payload, bucket)
        SELECT v.event_id, c.id, COALESCE(c.webhook_url, p.webhook_url, p_default_webhook_url),
               p.name,
               json_build_object(
                   'eventId', v.event_id, 'jobId', c.id, 'type', 'delivery', 'status', 'SENT',
                   'delivery', json_build_object('state', c.state, 'at', nq_rfc3339(c.at),
                                                 'reason', c.reason),
                   'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                   'provider', c.provider
               )::text,
               c.bucket
        FROM changed c CROSS JOIN LATERAL (SELECT gen_random_uuid() AS event_id) v
        LEFT JOIN nq_policies p ON p.name = c.policy
        WHERE COALESCE(c.webhook_url, p.webhook_url, p_default_webhook_url) IS NOT NULL
        RETURNING 1
    ), kube AS (
        -- A Notification object's status shows the receipt (operator/status.py): its write-back
        -- queued as a status change is, with the operator's wake-up.
        INSERT INTO nq_status_outbox (uid, namespace, name, notification_id, old_status, new_status)
        SELECT l.uid, l.namespace, l.name, c.id, 'SENT', 'SENT'
        FROM changed c JOIN nq_kube_links l ON l.notification_id = c.id
        -- nq_kube_links_notification, probed with the ids as one array (no nested loop here).
        WHERE l.notification_id = ANY(ARRAY(SELECT id FROM changed))
        RETURNING 1
    ), woken AS (
        -- A boolean, not pg_notify's void: Citus keeps a CTE's rows as an intermediate result.
        SELECT CASE WHEN count(*) > 0 THEN pg_notify('nq_status_outbox', '') IS NULL END
        FROM kube
    )
    -- IN: hashed subplans over the CTEs.
    SELECT e.state, e.ord IN (SELECT ord FROM found), e.ord IN (SELECT ord FROM changed)
    FROM e CROSS JOIN woken
    ORDER BY e.ord;
END
$$;
