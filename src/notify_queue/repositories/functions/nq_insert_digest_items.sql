-- A digest's items inserted: each joins its digest (nq_digest_join) and is parked but the carrier.
CREATE OR REPLACE FUNCTION nq_insert_digest_items(
{{_insert_signature}}
LANGUAGE sql VOLATILE AS $$
WITH request AS (
    SELECT * FROM json_to_recordset(p_items) AS r(
        {{_insert_request_columns}}, digest_key text, digest_window_seconds integer,
        digest_max_items integer, digest_template text)
), {{_insert_keys_accepted}},
           r.position, r.digest_key, r.digest_window_seconds, r.digest_max_items, r.digest_template
    FROM request r
    JOIN keys k ON k.notification_id = r.id
    LEFT JOIN nq_policies p ON p.name = r.policy
), joined AS (
    -- Digests (docs/digests.md): each item joins its recipient's open digest for the key
    -- and channel, or opens one, in the batch's order (nq_digest_join locks the digest row, so
    -- creates in other processes and the claim that closes it are serialised on it). A plain
    -- notification has no digest_key: no row here, no digest read.
    SELECT a.id, j.digest_id, j.carrier, j.closes_at, j.item_count,
           bool_or(j.closed) OVER (PARTITION BY j.digest_id) AS closed
    FROM (SELECT * FROM accepted WHERE digest_key IS NOT NULL AND status = 'PENDING'
          ORDER BY position) a
    CROSS JOIN LATERAL nq_digest_join(a.bucket, a.recipient, a.channel, a.digest_key,
                                      a.digest_window_seconds, a.digest_max_items,
                                      a.digest_template, a.id) j
), queued AS (
    INSERT INTO nq_jobs AS n (
        {{_insert_queued_columns}}, digest_id)
    SELECT a.id, a.idempotency_key, NULL, a.channel, a.recipient, a.subject, a.body,
           a.priority, a.status, a.send_at,
           -- A digest's carrier is due when the digest closes (now, when this batch filled it);
           -- its other items are parked a day past that: the carrier sends them.
           CASE WHEN j.id IS NULL THEN a.next_attempt_at
                WHEN j.carrier AND j.closed THEN now()
                WHEN j.carrier THEN j.closes_at
                ELSE j.closes_at + interval '1 day' END,
           a.expires_at, a.max_attempts,
           a.source, a.policy, a.webhook_url, a.metadata, a.last_error, a.finished_at,
           a.category, a.recipient_id, a.template_name, a.template_version, a.bucket,
           a.traceparent, a.tenant,
           CASE WHEN j.id IS NOT NULL AND j.carrier AND j.closed THEN NULL
                WHEN j.id IS NOT NULL THEN 'DigestWindow'
                WHEN a.send_at > now() THEN 'Scheduled' END,
           CASE WHEN j.id IS NOT NULL AND j.closed THEN NULL
                WHEN j.id IS NOT NULL THEN j.closes_at
                WHEN a.send_at > now() THEN a.send_at END,
           CASE WHEN j.id IS NOT NULL AND j.carrier AND j.closed THEN NULL
                WHEN j.id IS NOT NULL AND j.closed THEN 'sent with its digest ' || a.digest_key
                                                        || ', which is closed'
                WHEN j.id IS NOT NULL THEN 'digest ' || a.digest_key || ' collects until '
                                           || nq_rfc3339(j.closes_at) || ' or '
                                           || a.digest_max_items || ' items'
                WHEN a.send_at > now() THEN 'sendAt is in the future' END,
           j.digest_id
    FROM accepted a LEFT JOIN joined j ON j.id = a.id WHERE a.status = 'PENDING'
{{_insert_queued_log_half}}
$$;
