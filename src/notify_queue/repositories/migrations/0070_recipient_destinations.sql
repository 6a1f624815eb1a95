-- A recipient's chat, webhook and incident destinations (docs/channels.md): names that the
-- providers map to a channel id, URL or team. A table of its own beside nq_recipient_voices, for
-- the same reason (0020: a new column of nq_recipients breaks an older release's prepared
-- `SELECT *` during an upgrade); a row only for a recipient that has one, deleted with it
-- (sql/recipients.sql).
CREATE TABLE nq_recipient_destinations (
    recipient_id text PRIMARY KEY,
    chat         text,
    webhook      text,
    incident     text
);
