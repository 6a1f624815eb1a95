-- Escalation until acknowledged and the voice channel (docs/escalation.md has the states, the
-- lock order and the races). An expand step: the previous release never reads the new table or
-- column, and the functions keep their names, arguments and results.
--
-- 1. nq_escalations: one row per escalation, keyed (bucket, id) like the queue, so on Citus it is
--    co-located with its steps (repositories/citus_layout.sql distributes it on bucket). The
--    steps are notifications (nq_jobs.escalation_id, 0012); `step_ids` lists them in step order,
--    so the acknowledgement finds them by the queue's primary key (no index on escalation_id: the
--    queue's hot path writes no index entry for a feature most rows do not use). The state is
--    `acknowledged_at`: set once, by the acknowledgement, under the row's lock; `exhausted` is
--    read, not stored (every step final and no acknowledgement), so no worker writes this row.
-- 2. The channel `voice` (a phone call, E.164): the channel checks of 0008 go (the edge checks
--    the channel); recipients gain a `voice` number (nq_recipient_voices; none: their `phone`
--    is called).
-- 3. notify_queue_enqueue and its rules learn `voice` as the API did, and refuse `escalation`
--    with 0A000 (created through the API only; docs/enqueue.md): written in 0016, where the
--    function has its one definition in this release.

CREATE TABLE nq_escalations (
    bucket          smallint NOT NULL,
    id              uuid NOT NULL,
    recipient_id    text NOT NULL,
    -- The request's key: its first step has it, later steps "<key> step<N>" (services).
    idempotency_key text NOT NULL,
    -- The steps' notification ids in step order, and each step's channel and afterSeconds.
    step_ids        uuid[] NOT NULL,
    steps           jsonb NOT NULL,
    acknowledged_at timestamptz,
    acknowledged_by text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (bucket, id)
);
-- GET /escalations/{id} and the acknowledgement know only the id: one probe (one per shard on
-- Citus). The table is as big as the escalations, not the notifications.
CREATE INDEX nq_escalations_id ON nq_escalations (id);

-- A recipient's voice number, in a table of its own rather than a column of nq_recipients:
-- 0.1.0 reads recipients with `SELECT *` and `RETURNING r.*` in server-prepared statements,
-- which a new column breaks for the rest of each connection ("cached plan must not change result
-- type"): its recipientId creates answered 500 during the upgrade (tests/upgrade's load creates
-- some). A row only for a recipient that has one; the statement that deletes a recipient deletes
-- it (sql/recipients.sql; no foreign key: on Citus both are reference tables, and a foreign key
-- between them cannot be laid out in the transaction that distributes the rest).
CREATE TABLE nq_recipient_voices (
    recipient_id text PRIMARY KEY,
    voice        text NOT NULL
);

-- The channel checks of the queue (0008, on the table renamed nq_jobs in 0012) and the log would
-- refuse `voice`. A CHECK cannot be widened in place; adding a new one would validate every row
-- (the log's whole history: PostgreSQL has no NOT VALID on a partitioned table) and a NOT VALID
-- plus VALIDATE in the migrator's one transaction would hold reads for the queue's scan. The
-- channel is checked where every row comes in (services.validation, nq_enqueue_errors of 0016),
-- so the checks are dropped, not rebuilt. Constraint names as PostgreSQL made them in 0008.
-- Why: widening the allowed channels removes no guarantee a client of the previous release
-- relies on: it writes only email, sms and push.
-- squawk-ignore ban-drop-constraint
ALTER TABLE nq_jobs DROP CONSTRAINT IF EXISTS nq_queue_channel_check;
-- Why: as above, the log's copy of the same check.
-- squawk-ignore ban-drop-constraint
ALTER TABLE nq_delivery_log DROP CONSTRAINT IF EXISTS nq_delivery_log_channel_check;


