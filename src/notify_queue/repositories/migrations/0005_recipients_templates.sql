-- Recipients, their preferences, templates, and the SUPPRESSED state (docs/recipients.md).

-- A recipient: contacts per channel, a timezone and preferences. Preferences are columns, not a
-- jsonb document: the claim reads them for every user-targeted notification it takes (one
-- primary-key lookup per row), and typed columns keep that read cheap and the rules checkable.
CREATE TABLE nq_recipients (
    -- Chosen by the client (e.g. the application's user id).
    id                 text PRIMARY KEY,
    email              text,
    phone              text,
    -- A push goes to the first token (the client lists the current device first).
    push_tokens        text[] NOT NULL DEFAULT '{}',
    -- An IANA zone name, checked with zoneinfo by the API; quiet hours are read in it.
    timezone           text NOT NULL DEFAULT 'UTC',
    opt_out_all        boolean NOT NULL DEFAULT false,
    opt_out_channels   text[] NOT NULL DEFAULT '{}',
    opt_out_categories text[] NOT NULL DEFAULT '{}',
    -- Local wall-clock times; start > end is a window across midnight. Both or neither.
    quiet_start        time,
    quiet_end          time,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CHECK ((quiet_start IS NULL) = (quiet_end IS NULL))
);
-- No index beyond the primary key: every read is by id (API, expansion, claim).

-- Templates: per-channel subject and body, rendered at creation (never at send time), so a
-- notification keeps the text of the version it was made from.
CREATE TABLE nq_templates (
    name        text PRIMARY KEY,
    -- {"email": {"subject", "body"}, "sms": {"body"}, "push": {"subject", "body"}}
    channels    jsonb NOT NULL,
    -- Incremented by every change of channels; a PUT of the same content keeps it.
    version     integer NOT NULL DEFAULT 1,
    -- 'api' or 'kubernetes' (mirrored from a NotificationTemplate).
    source      text NOT NULL DEFAULT 'api',
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Who and what a notification was for. Nullable / defaulted columns: adding them rewrites
-- nothing (PostgreSQL stores the default in the catalogue), so this is instant on a full table.
ALTER TABLE nq_notifications
    ADD COLUMN recipient_id     text,
    ADD COLUMN category         text NOT NULL DEFAULT 'transactional',
    ADD COLUMN template_name    text,
    ADD COLUMN template_version integer;

-- SUPPRESSED: final, the recipient opted out (at creation or at send time). Replacing the CHECK
-- scans the table once under the migration's lock; the new list only adds a value, so every
-- existing row passes.
ALTER TABLE nq_notifications DROP CONSTRAINT nq_notifications_status_check;
ALTER TABLE nq_notifications ADD CONSTRAINT nq_notifications_status_check CHECK (status IN
    ('PENDING', 'PROCESSING', 'SENT', 'FAILED', 'DEAD_LETTERED', 'CANCELLED', 'EXPIRED', 'SUPPRESSED'));

-- GET /notifications?recipientId= (keyset pages, oldest first). Partial: address-targeted rows,
-- the bulk of a busy queue, add no entries, so sends without a recipient id pay nothing for it.
CREATE INDEX nq_notifications_recipient_id_created ON nq_notifications (recipient_id, created_at, id)
    WHERE recipient_id IS NOT NULL;
