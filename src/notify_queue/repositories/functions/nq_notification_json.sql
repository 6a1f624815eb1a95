-- A notification as the API answers it (docs/api-reference.md). `delivery` is null here: the SQL
-- door answers a create, before any receipt; GET /notifications/{id} reads the receipt
-- (docs/receipts.md). Reading nq_delivery_receipts here would make Citus copy this function to its
-- worker nodes, which it cannot do for a SQL-standard body.
CREATE OR REPLACE FUNCTION nq_notification_json(n nq_all_notifications) RETURNS jsonb
LANGUAGE sql STABLE
RETURN jsonb_build_object(
    'id', n.id, 'idempotencyKey', n.idempotency_key, 'channel', n.channel,
    'recipient', n.recipient, 'subject', n.subject, 'body', n.body,
    'priority', (ARRAY['HIGH', 'NORMAL', 'LOW'])[n.priority + 1], 'status', n.status,
    'sendAt', nq_rfc3339(n.send_at), 'nextAttemptAt', nq_rfc3339(n.next_attempt_at),
    'waiting', CASE WHEN n.status = 'PENDING' AND n.waiting_reason IS NOT NULL
                         AND (n.waiting_until IS NULL OR n.waiting_until > now())
                    THEN jsonb_build_object('reason', n.waiting_reason,
                                            'until', nq_rfc3339(n.waiting_until),
                                            'detail', CASE
                                                WHEN n.waiting_reason = 'Scheduled'
                                                     AND n.waiting_until IS NOT NULL
                                                THEN 'due at ' || nq_rfc3339(n.waiting_until)
                                                ELSE COALESCE(n.waiting_detail, n.waiting_reason)
                                            END)
               END,
    'expiresAt', nq_rfc3339(n.expires_at), 'attemptCount', n.attempt_count,
    'maxAttempts', n.max_attempts, 'lastError', n.last_error, 'sentAt', nq_rfc3339(n.sent_at),
    'providerMessageId', n.provider_message_id, 'provider', n.provider,
    'deliveryAttempts', n.delivery_attempts, 'delivery', NULL::jsonb, 'retries', n.retries, 'source', n.source,
    'metadata', n.metadata, 'createdAt', nq_rfc3339(n.created_at),
    'updatedAt', nq_rfc3339(n.updated_at), 'category', n.category,
    'recipientId', n.recipient_id,
    'template', CASE WHEN n.template_name IS NULL THEN NULL
                     ELSE jsonb_build_object('name', n.template_name,
                                             'version', n.template_version) END,
    'digest', CASE WHEN n.digest_id IS NULL THEN NULL
                   ELSE nq_digest_ref(n.bucket, n.digest_id) END);
