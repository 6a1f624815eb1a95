-- name: migration_lock
-- Serialises migrators: a session-level advisory lock, held across the per-migration transactions.
-- Tried, not waited for (schema.migrate polls): a statement waiting for it would hold a snapshot,
-- and CREATE INDEX CONCURRENTLY in the holder's session waits for every older snapshot to end.
SELECT pg_try_advisory_lock(%(key)s) AS locked

-- name: migration_unlock
SELECT pg_advisory_unlock(%(key)s)

-- name: migration_ledgers_create
-- The two ledgers (docs/upgrading.md). nq_schema_migrations holds the baseline, versions 1-8,
-- exactly as 0.1.0 wrote it: 0.1.0's /readyz compares its max(version) with 8 and its operator
-- refuses to start below 8, so nothing newer may ever be written there while 0.1.0 can run.
-- nq_schema_steps holds every later step with its phase; `release` says which program applied it.
CREATE TABLE IF NOT EXISTS nq_schema_migrations (
  version integer PRIMARY KEY,
  name text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS nq_schema_steps (
  version integer PRIMARY KEY,
  name text NOT NULL,
  phase text NOT NULL CHECK (phase IN ('expand', 'contract')),
  release text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
);
-- The digest of the function files `migrate` applied last (schema.py, "Functions"): one row.
CREATE TABLE IF NOT EXISTS nq_schema_functions (
  single boolean PRIMARY KEY DEFAULT true CHECK (single),
  digest text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: migration_versions
-- Every applied version with the name it was recorded under, baseline and steps alike (a name
-- this release's file of that version does not have is a step of the squashed history).
SELECT version, name FROM nq_schema_migrations
UNION ALL
SELECT version, name FROM nq_schema_steps

-- name: migration_record
-- A baseline version (1-8 only: see migration_ledgers_create).
INSERT INTO nq_schema_migrations (version, name) VALUES (%(version)s, %(name)s)

-- name: migration_step_record
INSERT INTO nq_schema_steps (version, name, phase, release)
VALUES (%(version)s, %(name)s, %(phase)s, %(release)s)

-- name: migration_table_exists
-- False on a database that was never migrated (to_regclass gives NULL instead of an error).
SELECT to_regclass('nq_schema_migrations') IS NOT NULL AS present,
       to_regclass('nq_schema_steps') IS NOT NULL AS steps_present

-- name: migration_current
SELECT max(version) AS version FROM nq_schema_migrations

-- name: migration_steps_applied
SELECT version, name FROM nq_schema_steps

-- name: migration_processes_connected
-- Who is connected to this database, by application name, other than the caller: every
-- Notify Queue process holds at least one pooled connection while it runs, named after its role
-- (and, from 0.2.0 on, `@<release>`), so this is the roll-call `migrate --contract` takes.
-- application_name is visible for every session, even to a role without pg_read_all_stats.
SELECT application_name, count(*) AS connections
FROM pg_stat_activity
WHERE datname = current_database()
  AND pid <> pg_backend_pid()
  AND application_name LIKE 'notify-queue%%'
GROUP BY application_name
ORDER BY application_name

-- name: migration_enqueue_role_state
-- Whether the role that may call notify_queue_enqueue exists, whether this user could create it
-- (CREATEROLE or superuser), and whether the function exists yet.
SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'notify_queue_enqueue') AS present,
       (SELECT rolcreaterole OR rolsuper FROM pg_roles WHERE rolname = current_user) AS can_create,
       to_regprocedure('notify_queue_enqueue(jsonb,text)') IS NOT NULL AS function_present

-- name: migration_enqueue_role_create
-- Roles belong to the server, not the database: NOLOGIN, so it is only ever granted to the
-- application's login users (docs/enqueue.md).
CREATE ROLE notify_queue_enqueue NOLOGIN

-- name: migration_enqueue_role_grant
-- The role may execute the function (SECURITY DEFINER: it runs as its owner) and use the schema
-- it lives in, nothing else: no table privilege. Granting USAGE on a schema this user does not
-- own only warns; PostgreSQL 15+ lets PUBLIC use `public` anyway.
DO $$
BEGIN
    EXECUTE 'GRANT EXECUTE ON FUNCTION notify_queue_enqueue(jsonb, text) TO notify_queue_enqueue';
    EXECUTE 'GRANT USAGE ON SCHEMA ' || quote_ident(current_schema()) || ' TO notify_queue_enqueue';
END $$

-- name: migration_runtime_role_state
-- Whether the runtime role exists and whether this user could create it (CREATEROLE or
-- superuser).
SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'notify_queue_runtime') AS present,
       (SELECT rolcreaterole OR rolsuper FROM pg_roles WHERE rolname = current_user) AS can_create

-- name: migration_runtime_role_create
-- The group role of the API, the workers, the relay and the operator (docs/operations.md,
-- "Database roles"): NOLOGIN, the deployment's login roles are granted into it.
CREATE ROLE notify_queue_runtime NOLOGIN

-- name: migration_runtime_role_grant
-- Data rights on what the schema has now, and on what this user makes in it later (the log's
-- partitions, made as their owner by nq_delivery_log_prepare); never CREATE on the schema nor
-- ownership of anything, so the roles that run cannot change the schema. EXECUTE on every
-- function of the schema: the runtime's statements call them (0044 took it from PUBLIC).
DO $$
DECLARE
    s text := quote_ident(current_schema());
BEGIN
    EXECUTE 'GRANT USAGE ON SCHEMA ' || s || ' TO notify_queue_runtime';
    EXECUTE 'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA ' || s
            || ' TO notify_queue_runtime';
    EXECUTE 'GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA ' || s
            || ' TO notify_queue_runtime';
    EXECUTE 'GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA ' || s || ' TO notify_queue_runtime';
    EXECUTE 'ALTER DEFAULT PRIVILEGES IN SCHEMA ' || s
            || ' GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO notify_queue_runtime';
    EXECUTE 'ALTER DEFAULT PRIVILEGES IN SCHEMA ' || s
            || ' GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO notify_queue_runtime';
    EXECUTE 'ALTER DEFAULT PRIVILEGES IN SCHEMA ' || s
            || ' GRANT EXECUTE ON FUNCTIONS TO notify_queue_runtime';
END $$

-- name: migration_enqueue_defaults_present
SELECT to_regclass('nq_enqueue_defaults') IS NOT NULL AS present

-- name: migration_enqueue_defaults_set
-- What notify_queue_enqueue takes from the deployment (0045): the values this `migrate` was
-- configured with; NULL keeps the stored one (a setting `migrate` was not given).
UPDATE nq_enqueue_defaults
SET max_attempts = COALESCE(%(max_attempts)s, max_attempts),
    webhook_url = CASE WHEN %(set_webhook_url)s THEN %(webhook_url)s ELSE webhook_url END

-- name: migration_function_bodies_unchecked
-- For this transaction only: function bodies are checked when called, not when defined (as
-- pg_dump restores them), so a SQL function may call one whose file comes later.
SELECT set_config('check_function_bodies', 'off', true)

-- name: migration_functions_digest
SELECT digest FROM nq_schema_functions

-- name: migration_functions_digest_set
INSERT INTO nq_schema_functions (digest) VALUES (%(digest)s)
ON CONFLICT (single) DO UPDATE SET digest = excluded.digest, applied_at = now()

-- name: migration_lock_timeout
-- For this migration's transaction only: how long one of its statements may wait for a lock
-- before the transaction gives up (and the migrator runs it again; schema.migrate).
SELECT set_config('lock_timeout', %(timeout)s, true)

-- name: migration_index_state
-- An index of the migrations' schema by name: no row when it does not exist, `valid` false when
-- a CREATE INDEX CONCURRENTLY that built it was interrupted (index_steps.build).
SELECT i.indisvalid AS valid
FROM pg_index i
WHERE i.indexrelid = to_regclass(%(name)s)

-- name: migration_index_drop_concurrently
-- An invalid index left by an interrupted concurrent build; dropped without blocking writes.
DROP INDEX CONCURRENTLY IF EXISTS {name}
