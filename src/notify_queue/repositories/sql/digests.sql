-- Digests (0009, docs/digests.md): what a carrier sends, and reads of a notification's digest.

-- name: digest_contents
-- The digests this worker's carriers send, read after the claim that closed them committed (a
-- statement of its own: it sees every item that joined before the close). Each digest's key and
-- template (its per-channel text, NULL when none or gone) and its items in the order they joined,
-- as the template sees them. Through the primary key and nq_jobs_digest.
SELECT d.id, d.key, d.template, t.channels AS template_channels,
       COALESCE(jsonb_agg(jsonb_build_object('subject', n.subject, 'body', n.body,
                                             'metadata', n.metadata,
                                             'createdAt', nq_rfc3339(n.created_at))
                          ORDER BY n.created_at, n.id) FILTER (WHERE n.id IS NOT NULL),
                '[]') AS items,
       -- The items' trace contexts: the carrier's delivery span links to each (docs/tracing).
       COALESCE(array_agg(n.traceparent ORDER BY n.created_at, n.id)
                    FILTER (WHERE n.traceparent IS NOT NULL), '{}') AS traceparents
FROM nq_digests d
LEFT JOIN nq_templates t ON t.name = d.template
LEFT JOIN nq_jobs n ON n.bucket = d.bucket AND n.digest_id = d.id
                   AND n.status IN ('PENDING', 'PROCESSING')
WHERE d.bucket = ANY(%(buckets)b::smallint[]) AND d.id = ANY(%(ids)b::uuid[])
GROUP BY d.bucket, d.id, d.key, d.template, t.channels

-- name: digest_refs
-- `digest: {key, id, count}` of the notifications read (only when one of them has a digest).
SELECT d.id, d.key, d.item_count FROM nq_digests d
WHERE d.bucket = ANY(%(buckets)b::smallint[]) AND d.id = ANY(%(ids)b::uuid[])

-- name: digest_cancel_lock
-- Cancel of a digest's item, first statement: its digest, locked (the lock order of a digest's
-- writers: the digest, then its items). A create joining it waits; a claim closing it skips it.
-- The caller goes on only while it is open; once closed, the item is being sent with it (409).
SELECT d.bucket, d.id, d.state FROM nq_digests d
WHERE (d.bucket, d.id) = (SELECT j.bucket, j.digest_id FROM nq_jobs j
                          WHERE j.id = %(id)s AND j.status = 'PENDING'
                            AND j.digest_id IS NOT NULL)
FOR UPDATE OF d

-- name: digest_item_cancel
-- Cancel of a digest's item, second statement (a new snapshot, after the digest's lock: every
-- item that joined is visible). The item leaves (nq_finish_held: CANCELLED, its webhook event), the
-- count drops; the last one leaving cancels the digest (nothing is sent). When the item was the
-- carrier, the oldest item left takes over, due when the window ends.
WITH pending AS (
    SELECT id FROM nq_jobs
    WHERE id = %(id)s AND status = 'PENDING' AND bucket = %(bucket)s AND digest_id = %(digest_id)s
    FOR UPDATE
), finished AS (
    SELECT f.id FROM nq_finish_held(ARRAY(SELECT id FROM pending), NULL,
                                    ARRAY(SELECT 'CANCELLED' FROM pending),
                                    NULL, NULL, NULL, NULL, NULL, %(default_webhook_url)s) AS f
), {{_digest_leave_successor}}, left_digest AS (
    UPDATE nq_digests d
    {{_digest_leave_set}}
    WHERE d.bucket = %(bucket)s AND d.id = %(digest_id)s AND EXISTS (SELECT 1 FROM pending)
    RETURNING d.closes_at, d.state
), {{_digest_leave_handed}}
SELECT (SELECT id FROM finished) AS id, (SELECT count(*) FROM handed) AS handed

-- name: _digest_leave_successor
-- An item leaving its digest, on both engines (digest_item_leave_bucket on Citus): the carrier
-- before, and the oldest other PENDING item, which takes over when the carrier leaves.
before AS (
    SELECT carrier_id FROM nq_digests WHERE bucket = %(bucket)s AND id = %(digest_id)s
), successor AS (
    SELECT j.id FROM nq_jobs j
    WHERE j.bucket = %(bucket)s AND j.digest_id = %(digest_id)s AND j.status = 'PENDING'
      AND j.id <> %(id)s
    ORDER BY j.created_at, j.id
    LIMIT 1
)

-- name: _digest_leave_set
-- The count drops; the last item leaving cancels the digest (nothing is sent); a carrier leaving
-- hands over to the successor. The time comes in from `c`: Citus refuses now() inside a CASE of
-- a distributed UPDATE's SET.
SET item_count = d.item_count - 1,
    state = CASE WHEN d.item_count <= 1 THEN 'cancelled' ELSE d.state END,
    closed_at = CASE WHEN d.item_count <= 1 THEN c.now ELSE d.closed_at END,
    carrier_id = CASE WHEN d.carrier_id = %(id)s
                      THEN COALESCE((SELECT id FROM successor), d.carrier_id)
                      ELSE d.carrier_id END
FROM (SELECT now() AS now) c

-- name: _digest_leave_handed
-- The successor of a carrier that left is due when the digest's window ends.
handed AS (
    UPDATE nq_jobs j
    SET next_attempt_at = l.closes_at, waiting_until = l.closes_at, updated_at = now()
    FROM left_digest l
    WHERE j.bucket = %(bucket)s AND j.id = (SELECT id FROM successor)
      AND (SELECT carrier_id FROM before) = %(id)s AND l.state = 'open'
    RETURNING j.id
)

-- name: digests_forget
-- Retention (services/retention.py): closed and cancelled digests closed longer ago than the
-- retention and a day (their items' log partitions go first, so no answer loses its `digest`
-- while its notification is still kept), unless an item of theirs is still in the queue. One
-- statement an hour, over what closed in an hour; the partial index nq_digests_closed finds them.
DELETE FROM nq_digests d
WHERE d.state <> 'open'
  AND d.closed_at < now() - make_interval(secs => %(retention_seconds)s + 86400)
  AND NOT EXISTS (SELECT 1 FROM nq_jobs j WHERE j.bucket = d.bucket AND j.digest_id = d.id)
