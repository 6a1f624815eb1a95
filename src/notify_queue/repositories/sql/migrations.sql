-- name: migration_lock
-- Serialises migrators: a session-level advisory lock, held across the per-migration transactions.
SELECT pg_advisory_lock(%(key)s)

-- name: migration_unlock
SELECT pg_advisory_unlock(%(key)s)

-- name: migration_versions
SELECT version FROM nq_schema_migrations

-- name: migration_record
INSERT INTO nq_schema_migrations (version, name) VALUES (%(version)s, %(name)s)

-- name: migration_table_exists
-- False on a database that was never migrated (to_regclass gives NULL instead of an error).
SELECT to_regclass('nq_schema_migrations') IS NOT NULL AS present

-- name: migration_current
SELECT max(version) AS version FROM nq_schema_migrations
