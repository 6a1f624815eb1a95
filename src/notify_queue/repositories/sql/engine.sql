-- Which engine the database is (CONTRACT section 11): plain PostgreSQL, or a Citus coordinator
-- with worker nodes. Two statements because pg_dist_node exists only where the extension is
-- installed: a query naming it fails to parse on plain PostgreSQL. Read rarely (the answer is
-- cached per process: it changes only when an operator adds or removes a node).

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
