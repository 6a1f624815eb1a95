-- What providers report after they accepted a message (docs/receipts.md): a notification's
-- latest delivery receipt, and the index that finds a notification by the provider's id for it.
--
-- One row per notification, beside the queue and the log rather than a column of theirs: a
-- receipt arrives after the row is final, and the log is written once (its rows are never
-- updated, so a completion stays one insert). Reads join it by id.
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

-- Receipts name the provider and its message id; only SENT rows (in the log) have one.
-- squawk-ignore require-concurrent-index-creation
CREATE INDEX nq_delivery_log_provider_message ON nq_delivery_log (provider_message_id, provider)
    WHERE provider_message_id IS NOT NULL;
