-- Which engine the database is: plain PostgreSQL, or a Citus coordinator whose schema `migrate`
-- has distributed. Separate statements because pg_dist_node and pg_dist_partition exist only
-- where the extension is installed: a query naming them fails to parse on plain PostgreSQL. Read
-- rarely (the answer is cached per process: it changes only when `migrate` distributes the
-- schema, or an operator adds or removes a node).

-- name: database_engine_citus_installed
-- The extension installed in this database, not merely available on the server: a database
-- without `CREATE EXTENSION citus` is plain PostgreSQL however the server was started.
SELECT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') AS installed

-- name: database_engine_citus_worker_nodes
-- Registered worker nodes: primaries that the coordinator routes to (isactive is false only after
-- citus_disable_node; a node that is down for a moment stays registered). Group 0 is the
-- coordinator itself, not a worker node.
SELECT count(*)::integer AS n
FROM pg_catalog.pg_dist_node
WHERE noderole = 'primary' AND isactive AND groupid <> 0

-- name: database_engine_citus_distributed
-- The layout, not the node list, decides which statements the roles run: a node registered
-- before `migrate` has distributed the schema leaves every table on the coordinator, where the
-- plain statements are the ones that work (docs/scaling.md). Distributed means the queue is
-- (citus/layout.sql) and so is the last function delegated after it (citus/functions.sql, the
-- next transaction of the same `migrate`): the Citus statements call those functions.
SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
               WHERE logicalrelid = to_regclass('nq_jobs'))
       AND EXISTS (SELECT FROM pg_catalog.pg_dist_object o
                   JOIN pg_catalog.pg_proc p ON o.classid = 'pg_catalog.pg_proc'::regclass
                                            AND o.objid = p.oid
                   WHERE p.proname = 'nq_recover_expired_leases_bucket'
                     AND o.distribution_argument_index IS NOT NULL) AS distributed
