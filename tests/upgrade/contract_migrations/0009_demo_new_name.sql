-- Expand: the new column, backfilled from the old one (a real rename would also keep the two equal
-- while both exist, with a trigger or by writing both: docs/upgrading.md).
ALTER TABLE nq_demo ADD COLUMN new_name text;
UPDATE nq_demo SET new_name = old_name;
