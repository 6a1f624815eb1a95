-- The request hash kept with a key as 16 bytes instead of 65, expand half; 0036 makes the insert
-- functions write it.
--
-- A key's row kept the hash of its request as 64 hex characters (65 B on disk): SHA-256 of the
-- request as sent. What it is for, telling the same request (200) from another (409) under one
-- key, needs far fewer bits than that: the first 128 bits (16 B, `bytea`) leave a chance of
-- 2^-128 that another request passes for the same one, and no search finds such a pair. This
-- step adds `request_digest`, those 16 bytes, beside the column, and makes `request_hash`
-- nullable; a key's stored hash is read as `nq_stored_hash(request_digest, request_hash)`: 32
-- hex characters, from whichever form the row has (the first 32 of a full one), compared with
-- the first 32 of a request's hash. The SQL door (notify_queue_enqueue) reads it so from this
-- step on, the API from this release on (notification_get_by_keys). The previous release reads
-- and compares the full hex form, so every create keeps writing it until the contract step.
DO $$
BEGIN
    -- Through EXECUTE: a Citus coordinator sends DDL on to its worker nodes as the text it was
    -- given (migrations/__init__.py).
    EXECUTE 'ALTER TABLE nq_idempotency_keys ADD COLUMN request_digest bytea';
    EXECUTE 'ALTER TABLE nq_idempotency_keys ALTER COLUMN request_hash DROP NOT NULL';
END $$;
