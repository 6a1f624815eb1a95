-- Notify Queue schema, version 1.
-- Every table is prefixed nq_ so the schema can share a database with an application.

-- The queue and the record of every notification. One row per notification, updated in place
-- through its life; final rows stay for history (partition or archive them, see docs/operations.md).
CREATE TABLE nq_notifications (
    id                  uuid PRIMARY KEY,
    -- Unique: two identical requests at the same moment create one row (the loser's INSERT
    -- ... ON CONFLICT DO NOTHING returns nothing and it reads the winner's row instead).
    idempotency_key     text NOT NULL UNIQUE,
    -- A hash of the request as sent: the same key with another hash is a 409.
    request_hash        text NOT NULL,
    channel             text NOT NULL CHECK (channel IN ('email', 'sms', 'push')),
    recipient           text NOT NULL,
    subject             text,
    body                text NOT NULL,
    -- 0 HIGH, 1 NORMAL, 2 LOW: an integer so the claim index sorts HIGH first.
    priority            smallint NOT NULL CHECK (priority BETWEEN 0 AND 2),
    status              text NOT NULL CHECK (status IN
                            ('PENDING', 'PROCESSING', 'SENT', 'FAILED', 'DEAD_LETTERED', 'CANCELLED', 'EXPIRED')),
    send_at             timestamptz NOT NULL,
    -- When the notification is next due: send_at at first, then after each backoff or rate-limit wait.
    next_attempt_at     timestamptz NOT NULL,
    expires_at          timestamptz,
    attempt_count       integer NOT NULL DEFAULT 0,
    max_attempts        integer NOT NULL,
    last_error          text,
    sent_at             timestamptz,
    provider_message_id text,
    -- The current holder's token: a result is accepted only with this token (a slow worker whose
    -- lease expired cannot overwrite the newer holder's result).
    claim_token         uuid,
    lease_expires_at    timestamptz,
    retries             jsonb NOT NULL DEFAULT '[]',
    source              text NOT NULL DEFAULT 'api',
    policy              text,
    webhook_url         text,
    metadata            jsonb NOT NULL DEFAULT '{}',
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    finished_at         timestamptz
) WITH (fillfactor = 80);
-- fillfactor 80 leaves room on each page so the status updates of a row's life can be HOT updates
-- (no new index entries), as long as they change no indexed column other than those of partial
-- indexes whose predicate... in practice the claim index changes anyway; the room still keeps the
-- new row version on the same page and the table from bloating.

-- The claim index: only PENDING rows, already in claim order. Claiming reads the top of one
-- priority's range and never touches finished rows, so its cost stays flat however many SENT rows
-- pile up. The claim query walks it once per priority (see claim_due_notifications).
CREATE INDEX nq_notifications_claim ON nq_notifications (priority, next_attempt_at, created_at)
    WHERE status = 'PENDING';

-- Leases to recover: only PROCESSING rows, by lease end.
CREATE INDEX nq_notifications_lease ON nq_notifications (lease_expires_at)
    WHERE status = 'PROCESSING';

-- Expiry sweep: only unfinished rows that can expire.
CREATE INDEX nq_notifications_expiry ON nq_notifications (expires_at)
    WHERE status = 'PENDING' AND expires_at IS NOT NULL;

-- Listing (keyset pagination, oldest first) overall, by status (the dead-letter queue) and by recipient.
CREATE INDEX nq_notifications_created ON nq_notifications (created_at, id);
CREATE INDEX nq_notifications_status_created ON nq_notifications (status, created_at, id);
CREATE INDEX nq_notifications_recipient_created ON nq_notifications (recipient, created_at, id);

-- Rolling-window rate limits: one slot per delivery taken, kept while it counts.
-- A slot is taken when a notification is claimed (so two workers cannot both take the last one)
-- and given back in the completion transaction when the attempt did not deliver.
CREATE TABLE nq_rate_slots (
    notification_id uuid PRIMARY KEY,
    recipient       text NOT NULL,
    taken_at        timestamptz NOT NULL
);
-- Counting a recipient's slots in the window, and finding when the oldest one frees.
CREATE INDEX nq_rate_slots_recipient ON nq_rate_slots (recipient, taken_at);
-- Pruning slots older than every window.
CREATE INDEX nq_rate_slots_taken ON nq_rate_slots (taken_at);

-- Delivery policies (mirrored from NotificationPolicy resources; name is namespace/name).
-- NULL columns fall back to the worker's defaults.
CREATE TABLE nq_policies (
    name                       text PRIMARY KEY,
    rate_limit                 integer CHECK (rate_limit > 0),
    rate_window_seconds        double precision CHECK (rate_window_seconds > 0),
    max_attempts               integer CHECK (max_attempts > 0),
    backoff_base_seconds       double precision CHECK (backoff_base_seconds > 0),
    backoff_max_seconds        double precision CHECK (backoff_max_seconds > 0),
    webhook_url                text,
    webhook_secrets            text[] NOT NULL DEFAULT '{}',
    ttl_seconds_after_finished integer CHECK (ttl_seconds_after_finished >= 0),
    updated_at                 timestamptz NOT NULL DEFAULT now()
);

-- The webhook outbox: written in the same transaction as the status change it reports, then
-- dispatched by workers (at least once, same id every time).
CREATE TABLE nq_webhook_events (
    id               uuid PRIMARY KEY,
    notification_id  uuid NOT NULL,
    url              text NOT NULL,
    -- The policy whose secrets sign the event, read at dispatch time so a rotation applies at once;
    -- NULL signs with the worker's --webhook-secret.
    policy           text,
    payload          text NOT NULL,
    state            text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    claim_token      uuid,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz
);
-- Dispatch index: only pending events, in due order (a dispatcher's lease is a future next_attempt_at).
CREATE INDEX nq_webhook_events_due ON nq_webhook_events (next_attempt_at) WHERE state = 'pending';
CREATE INDEX nq_webhook_events_notification ON nq_webhook_events (notification_id);
