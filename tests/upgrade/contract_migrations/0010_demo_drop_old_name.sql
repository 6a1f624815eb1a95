-- Contract: the old column goes once no process of the previous release is left.
-- phase: contract
ALTER TABLE nq_demo DROP COLUMN old_name;
