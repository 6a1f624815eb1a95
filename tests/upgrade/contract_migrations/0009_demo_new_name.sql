-- Expand: the new column, kept equal to the old one by a trigger while both exist.
ALTER TABLE nq_demo ADD COLUMN new_name text;
UPDATE nq_demo SET new_name = old_name;
