-- Tenants: every notification, escalation and digest belongs to one, `default` unless the API
-- says otherwise (docs/tenants.md). Expand only: a column with a constant default, which
-- PostgreSQL 11 and later record in the catalog alone (no table rewrite, no row read: the ACCESS
-- EXCLUSIVE lock lasts a moment however many hundred million rows the queue or the log holds),
-- and which the previous release's writes fill in; the previous releases name every column of
-- these tables, so a new one breaks none of their statements. Recipients and templates get no
-- column: 0.1.0 reads nq_recipients and 0.2.0 nq_templates with `SELECT *` in prepared
-- statements, which a new column breaks during a roll-out.
--
-- One table per step (0085-0088, then the view in 0089): a step holds one table's lock at a
-- time, so it cannot deadlock with the previous release's transactions, which take these tables
-- in their own orders (both holding one and waiting for the other's).

ALTER TABLE nq_jobs ADD COLUMN IF NOT EXISTS tenant text NOT NULL DEFAULT 'default';
