-- Tenants: every notification, escalation and digest belongs to one, `default` unless the API
-- says otherwise. Expand only: a column with a constant default, which PostgreSQL 11 and later
-- record in the catalog alone (no table rewrite, no row read: the ACCESS EXCLUSIVE lock lasts a
-- moment however many hundred million rows the queue or the log holds), and which the previous
-- release's writes fill in. The previous releases name every column of these tables, so a new
-- one breaks none of their statements. Recipients and templates get no column: 0.1.0 reads
-- nq_recipients and 0.2.0 nq_templates with `SELECT *` in prepared statements, which a new
-- column breaks during a roll-out ("cached plan must not change result type").
--
-- Through EXECUTE: on a Citus coordinator a statement on a distributed table is sent on to the
-- worker nodes as the text it was given, which must be one command.
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['nq_jobs', 'nq_delivery_log', 'nq_escalations', 'nq_digests'] LOOP
        EXECUTE 'ALTER TABLE ' || quote_ident(t)
                || ' ADD COLUMN IF NOT EXISTS tenant text NOT NULL DEFAULT ''default''';
    END LOOP;
END $$;

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
