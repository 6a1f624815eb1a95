-- The tenant of every row of nq_delivery_log, as 0085 adds it to the queue (one table per step: 0085).

ALTER TABLE nq_delivery_log ADD COLUMN IF NOT EXISTS tenant text NOT NULL DEFAULT 'default';
