-- What providers report after they accepted a message (docs/receipts.md): a notification's
-- latest delivery receipt, and the index that finds a notification by the provider's id for it.
--
-- One row per notification, beside the queue and the log rather than a column of theirs: a
-- receipt arrives after the row is final, and the log is written once (its rows are never
-- updated, so a completion stays one insert). Reads join it by id.
--
-- The index that finds a log row by its provider's message id is built as 0009 builds
-- nq_delivery_log_unsent: ON ONLY the log (no partition read in this transaction), parts for the
-- partitions without rows here, the partitions with rows left to the workers' housekeeping
-- (CONCURRENTLY, then attached: repositories/delivery_log.py). A partition made from now on
-- gets its part when it is attached.
-- functions: nq_delivery_log_index_missing
CREATE TABLE nq_delivery_receipts (
    notification_id uuid PRIMARY KEY,
    provider        text NOT NULL,
    state           text NOT NULL CHECK (state IN ('delivered', 'bounced', 'complained')),
    -- When the vendor says it happened, else when the receipt arrived.
    at              timestamptz NOT NULL,
    reason          text,
    -- A bounce the vendor calls permanent (a complaint always is): it outranks a temporary one.
    permanent       boolean NOT NULL DEFAULT false,
    received_at     timestamptz NOT NULL DEFAULT now()
);

-- Receipts name the provider and its message id; only SENT rows (in the log) have one. Through
-- EXECUTE: a Citus coordinator sends the statement on to the workers as the text it was given,
-- and as part of this file it is several commands, which they refuse (tests/citus).
DO $$
BEGIN
    EXECUTE 'CREATE INDEX nq_delivery_log_provider_message ON ONLY nq_delivery_log'
            ' (provider_message_id, provider) WHERE provider_message_id IS NOT NULL';
END $$;

DO $$
DECLARE
    m record;
BEGIN
    FOR m IN SELECT * FROM nq_delivery_log_index_missing('nq_delivery_log_provider_message')
             WHERE NOT has_rows LOOP
        IF m.index_valid IS DISTINCT FROM true THEN
            EXECUTE 'DROP INDEX IF EXISTS ' || quote_ident(m.index_name);
            EXECUTE 'CREATE INDEX ' || quote_ident(m.index_name) || ' ON '
                    || quote_ident(m.partition_name) || m.index_using;
        END IF;
        EXECUTE 'ALTER INDEX nq_delivery_log_provider_message ATTACH PARTITION '
                || quote_ident(m.index_name);
    END LOOP;
END $$;
