-- Delivery receipts and the suppression list (docs/receipts.md).

-- name: receipts_record
-- Verified receipts (of one request or of several that arrived together): nq_record_receipts
-- matches, stores, suppresses and writes the webhook events in this one statement. One row per
-- event, in order.
SELECT state, matched, changed
FROM nq_record_receipts(%(events)s::jsonb, %(default_webhook_url)s)

-- name: suppressions_list
-- A page of the suppression list in (channel, address) order, after the cursor's key; the
-- primary key is the order, so each page is one index range.
SELECT channel, address, reason, at, notification_id
FROM nq_suppressions
WHERE tenant = %(tenant)s
  AND (%(channel)s::text IS NULL OR channel = %(channel)s)
  AND (%(address)s::text IS NULL OR address = nq_normalised_address(channel, %(address)s))
  AND (%(after_channel)s::text IS NULL OR (channel, address) > (%(after_channel)s, %(after_address)s))
ORDER BY channel, address
LIMIT %(limit)s

-- name: suppression_delete
-- Take an address off the list; a row back says it was there.
DELETE FROM nq_suppressions
WHERE tenant = %(tenant)s AND channel = %(channel)s
  AND address = nq_normalised_address(%(channel)s, %(address)s)
RETURNING 1 AS deleted

-- name: suppressions_count
-- The list's size per channel, for the notify_queue_suppressions gauge.
SELECT channel, count(*) AS n FROM nq_suppressions GROUP BY channel

-- name: suppressions_find
-- Which of these (channel, address) pairs are suppressed, and why: the send-time and the
-- creation-time checks, one primary-key probe per pair.
SELECT c.channel, c.address, s.reason
FROM unnest(%(channels)s::text[], %(addresses)s::text[]) AS c(channel, address)
JOIN nq_suppressions s
  ON s.tenant = %(tenant)s AND s.channel = c.channel
 AND s.address = nq_normalised_address(c.channel, c.address)

-- name: delivery_receipts_get
-- The delivery receipts of these notifications (the SENT ones of a read), by primary key.
SELECT notification_id, state, at, reason
FROM nq_delivery_receipts WHERE notification_id = ANY(%(ids)s::uuid[])
