-- The baseline: a table the previous release writes.
CREATE TABLE nq_demo (id bigint PRIMARY KEY, old_name text);
