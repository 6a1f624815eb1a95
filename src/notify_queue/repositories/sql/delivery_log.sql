-- The delivery log's partitions: created ahead, dropped after the retention (0008).

-- name: delivery_log_prepare
SELECT nq_delivery_log_prepare(%(days_ahead)s) AS created

-- name: delivery_log_expired
SELECT partition_name, attached, detach_pending
FROM nq_delivery_log_expired(make_interval(secs => %(retention_seconds)s))

-- name: delivery_log_forget_keys
SELECT nq_delivery_log_forget_keys(%(partition)s, %(after)s, %(limit)s) AS last_id

-- name: delivery_log_drop
SELECT nq_delivery_log_drop(%(partition)s) AS dropped

-- name: delivery_log_owned
-- Whether this connection's user owns the log (or is a member of its owner): DETACH and DROP are
-- the owner's; the runtime role retires a partition through nq_delivery_log_retire (0045).
SELECT pg_has_role(current_user, c.relowner, 'USAGE') AS owned
FROM pg_class c WHERE c.oid = 'nq_delivery_log'::regclass

-- name: delivery_log_retire
-- A partition detached (plain DETACH) and dropped as the log's owner, for the runtime role.
SELECT nq_delivery_log_retire(%(partition)s) AS dropped

-- name: delivery_log_lock
-- One run of %(run)s (retention, the index parts' build) at a time across workers; session-level:
-- the run spans transactions.
SELECT pg_try_advisory_lock(hashtextextended(%(run)s, 0)) AS locked

-- name: delivery_log_unlock
SELECT pg_advisory_unlock(hashtextextended(%(run)s, 0))

-- name: delivery_log_detach
-- {partition} is an identifier the driver quotes (Connection.execute_on): DETACH takes no
-- parameters, and CONCURRENTLY cannot run inside a function. Completions and reads of the log
-- never wait for it: it takes only a SHARE UPDATE EXCLUSIVE lock on the log.
ALTER TABLE nq_delivery_log DETACH PARTITION {partition} CONCURRENTLY

-- name: delivery_log_detach_finalize
-- A concurrent detach that was interrupted leaves the partition "detach pending": finish it.
ALTER TABLE nq_delivery_log DETACH PARTITION {partition} FINALIZE

-- name: delivery_log_index_missing
-- The partitions whose part of the log's index %(index)s is not attached yet (0009, 0075).
SELECT partition_name, index_name, index_valid, index_using
FROM nq_delivery_log_index_missing(%(index)s)

-- name: delivery_log_index_drop
-- An index part whose CONCURRENTLY build was cut short (left invalid): dropped before it is
-- built again. {index} is an identifier the driver quotes (Connection.execute_on).
DROP INDEX CONCURRENTLY IF EXISTS {index}

-- name: delivery_log_index_build
-- A partition's part of one of the log's indexes, built without holding its writers back
-- (CONCURRENTLY: two scans of the partition, waiting for the transactions that were writing it).
-- {using} is the parent index's definition from the catalog (nq_delivery_log_index_missing).
CREATE INDEX CONCURRENTLY {index} ON {partition} {using}

-- name: delivery_log_index_attach
-- With its last part attached, the log's index becomes valid (0015 waits for that of
-- nq_delivery_log_unsent).
ALTER INDEX {parent} ATTACH PARTITION {index}
