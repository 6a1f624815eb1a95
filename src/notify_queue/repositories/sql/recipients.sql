-- Recipients (contacts and preferences) and templates: the API's CRUD and the reads of a
-- user-targeted create. Every statement goes through a primary key.

-- name: recipient_put
-- Create or replace a recipient as a whole (PUT). `created` tells 201 from 200: xmax is 0 only
-- for a row this statement inserted.
-- The voice number lives in nq_recipient_voices (0020: a new column would break 0.1.0's
-- `SELECT *` during an upgrade), the chat, webhook and incident destinations in
-- nq_recipient_destinations (0070, likewise): set or removed in the same statement.
-- now() is in VALUES and DO UPDATE takes it from `excluded`: Citus refuses a non-IMMUTABLE
-- function in DO UPDATE SET (recipients are a reference table).
WITH r AS (
    INSERT INTO nq_recipients AS r (id, email, phone, push_tokens, timezone, opt_out_all,
                                    opt_out_channels, opt_out_categories, quiet_start, quiet_end,
                                    updated_at)
    VALUES (%(id)s, %(email)s, %(phone)s, %(push_tokens)s, %(timezone)s, %(opt_out_all)s,
            %(opt_out_channels)s, %(opt_out_categories)s, %(quiet_start)s, %(quiet_end)s, now())
    ON CONFLICT (id) DO UPDATE SET
        email = excluded.email, phone = excluded.phone, push_tokens = excluded.push_tokens,
        timezone = excluded.timezone, opt_out_all = excluded.opt_out_all,
        opt_out_channels = excluded.opt_out_channels,
        opt_out_categories = excluded.opt_out_categories,
        quiet_start = excluded.quiet_start, quiet_end = excluded.quiet_end,
        updated_at = excluded.updated_at
    RETURNING r.id, r.email, r.phone, r.push_tokens, r.timezone, r.opt_out_all,
              r.opt_out_channels, r.opt_out_categories, r.quiet_start, r.quiet_end, r.created_at,
              r.updated_at, (r.xmax = 0) AS created
), voice_set AS (
    INSERT INTO nq_recipient_voices AS v (recipient_id, voice)
    SELECT r.id, %(voice)s FROM r WHERE %(voice)s::text IS NOT NULL
    ON CONFLICT (recipient_id) DO UPDATE SET voice = excluded.voice
), voice_unset AS (
    DELETE FROM nq_recipient_voices v WHERE v.recipient_id = %(id)s AND %(voice)s::text IS NULL
), destinations_set AS (
    INSERT INTO nq_recipient_destinations AS d (recipient_id, chat, webhook, incident)
    SELECT r.id, %(chat)s, %(webhook)s, %(incident)s FROM r
    WHERE COALESCE(%(chat)s::text, %(webhook)s::text, %(incident)s::text) IS NOT NULL
    ON CONFLICT (recipient_id) DO UPDATE SET
        chat = excluded.chat, webhook = excluded.webhook, incident = excluded.incident
), destinations_unset AS (
    DELETE FROM nq_recipient_destinations d WHERE d.recipient_id = %(id)s
    AND COALESCE(%(chat)s::text, %(webhook)s::text, %(incident)s::text) IS NULL
)
SELECT r.id, r.email, r.phone, %(voice)s::text AS voice, %(chat)s::text AS chat,
       %(webhook)s::text AS webhook, %(incident)s::text AS incident, r.push_tokens, r.timezone,
       r.opt_out_all, r.opt_out_channels, r.opt_out_categories, r.quiet_start, r.quiet_end,
       r.created_at, r.updated_at, r.created
FROM r

-- name: _recipient_columns
-- A recipient's columns, named (a `*` in a prepared statement breaks when a release adds one).
r.id, r.email, r.phone, v.voice, d.chat, d.webhook, d.incident, r.push_tokens, r.timezone,
r.opt_out_all, r.opt_out_channels, r.opt_out_categories, r.quiet_start, r.quiet_end, r.created_at,
r.updated_at

-- name: _recipients_with_contacts
-- The recipients with their voice numbers (0020) and destinations (0070), as _recipient_columns
-- reads them.
nq_recipients r LEFT JOIN nq_recipient_voices v ON v.recipient_id = r.id
LEFT JOIN nq_recipient_destinations d ON d.recipient_id = r.id

-- name: recipient_get
SELECT {{_recipient_columns}} FROM {{_recipients_with_contacts}} WHERE r.id = %(id)s

-- name: recipient_get_for_update
-- The read-modify-write of a PATCH: the row lock makes two merges apply one after the other.
SELECT {{_recipient_columns}} FROM {{_recipients_with_contacts}} WHERE r.id = %(id)s FOR UPDATE OF r

-- name: recipient_get_many
-- The recipients of a user-targeted batch. FOR SHARE: a DELETE or an opt-out committed while
-- this transaction expands waits for it (and the claim then re-checks anyway).
SELECT {{_recipient_columns}} FROM {{_recipients_with_contacts}} WHERE r.id = ANY(%(ids)b::text[])
FOR SHARE OF r

-- name: recipient_delete
-- With its voice number (nq_recipient_voices, 0020) and destinations (0070), in one statement.
WITH gone AS (
    DELETE FROM nq_recipients WHERE id = %(id)s RETURNING id
), voice_gone AS (
    DELETE FROM nq_recipient_voices v WHERE v.recipient_id = %(id)s
), destinations_gone AS (
    DELETE FROM nq_recipient_destinations d WHERE d.recipient_id = %(id)s
)
SELECT id FROM gone

-- name: template_put
-- Create or update a template. The version moves only when the content changes (the WHERE of
-- DO UPDATE), so re-applying the same manifest or PUT keeps it; then nothing is returned and
-- the caller reads the row as it is. now() from `excluded`, as recipient_put.
INSERT INTO nq_templates AS t (name, channels, source, updated_at)
VALUES (%(name)s, %(channels)s, %(source)s, now())
ON CONFLICT (name) DO UPDATE SET
    channels = excluded.channels, source = excluded.source,
    version = t.version + 1, updated_at = excluded.updated_at
WHERE t.channels IS DISTINCT FROM excluded.channels
RETURNING t.*, (t.xmax = 0) AS created

-- name: template_get
SELECT * FROM nq_templates WHERE name = %(name)s

-- name: template_get_many
SELECT * FROM nq_templates WHERE name = ANY(%(names)b::text[])

-- name: template_delete
DELETE FROM nq_templates WHERE name = %(name)s RETURNING name
