-- The hash of the request that made a notification is kept once, with its idempotency key
-- (a copy less per row), expand half; 0033 stops writing the rows' copy.
--
-- Every queue and log row carried `request_hash` (64 hex characters, 65 B on disk) beside the
-- same hash in nq_idempotency_keys, the one place a key is unique: written at the create and
-- again when the row moved into the log, about 135 B of WAL per notification. Its readers are the
-- answers to a key seen before (200 for the same request, 409 for another), which read the key
-- anyway. This step makes the rows' column nullable; the SQL door (notify_queue_enqueue)
-- compares with the key's hash: the same result for every row, since each key has been written
-- with its row's hash since 0008. The API's reads do the same from this release on
-- (notification_get_by_keys). The previous release reads the rows' column, so they keep getting
-- it until the contract step.
DO $$
BEGIN
    -- Through EXECUTE: a Citus coordinator sends DDL on to its worker nodes as the text it was
    -- given (migrations/__init__.py).
    EXECUTE 'ALTER TABLE nq_jobs ALTER COLUMN request_hash DROP NOT NULL';
    EXECUTE 'ALTER TABLE nq_delivery_log ALTER COLUMN request_hash DROP NOT NULL';
END $$;
