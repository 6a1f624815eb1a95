-- NotificationPolicy readiness (docs/operator.md): policies fail closed.
--
-- The operator mirrors every NotificationPolicy, including one whose webhook Secret is missing
-- or whose spec cannot be used; such a row has ready = false, and workers hold the
-- notifications that name it (claim_admit_candidates defers them without using an attempt)
-- instead of sending them under the defaults. A notification whose policy has no row at all
-- (no NotificationPolicy of that name exists) still uses the defaults, as before.
-- DEFAULT true: rows mirrored before this migration were mirrored because they were usable.
ALTER TABLE nq_policies ADD COLUMN ready boolean NOT NULL DEFAULT true;
