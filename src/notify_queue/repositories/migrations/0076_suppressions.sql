-- The suppression list (docs/receipts.md): addresses a provider reported as permanently
-- bounced or complaining. A later notification to one ends SUPPRESSED without a provider call.
-- The tenant is 'default' until notifications carry a tenant.
CREATE TABLE nq_suppressions (
    tenant          text NOT NULL DEFAULT 'default',
    channel         text NOT NULL,
    -- Normalised: an email address lower-cased and trimmed, a phone number as stored.
    address         text NOT NULL,
    reason          text NOT NULL CHECK (reason IN ('bounced', 'complained')),
    at              timestamptz NOT NULL,
    notification_id uuid,
    PRIMARY KEY (tenant, channel, address)
);
