-- The schema's functions run only for the roles they are granted to (docs/security.md, "The
-- database: roles and privileges").
--
-- PostgreSQL grants EXECUTE to PUBLIC on every function it creates, so a role granted
-- notify_queue_enqueue alone (docs/enqueue.md) could still call every other function of the
-- schema, among them the SECURITY DEFINER ones that write as the owner. Revoked here from PUBLIC
-- on every function there is; the owner (the migrating user) keeps its own right, and `migrate`
-- grants each application role what it needs after every run (repositories/schema.py).
DO $$
BEGIN
    EXECUTE 'REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA ' || quote_ident(current_schema())
            || ' FROM PUBLIC';
END $$;

-- And on every function the migrating user makes from now on: the later migrations, and the
-- delegated functions citus_functions.sql (re)defines on each `migrate`. Default privileges are
-- the creating role's, in this database; PostgreSQL cannot take a right away per schema (a
-- schema's defaults only add to the global ones), so this is the global default of that role.
ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
