-- The provider a notification's attempt is bound to (issue 19, item 5; docs/providers.md
-- "Failover and the cost of a duplicate").
--
-- Before a provider is called, the row says which one: the claim binds it to the head of its
-- chain (in the claim's own UPDATE), and a delivery that calls another provider writes that one
-- first. So when the outcome of the call is unknown (a timeout, a worker killed during the call,
-- a result that could not be recorded before the lease ran out) the row still names the only
-- provider that may have delivered it, and under OnDefiniteFailure it is sent nowhere else. A
-- completion keeps the binding only while an attempt's outcome there is unknown; a provider's
-- answer that proves nothing was sent, or no call at all, clears it.
--
-- Expand-only: a nullable column, metadata only, no rewrite. NULL means "no binding": what
-- 0.1.0 workers leave (they neither read nor write it). The delivery log gets the column too,
-- at the same position, because the move trigger copies a finished row with `SELECT *`. An
-- operator's retry (nq_delivery_log_retry, 0008/0011) inserts the columns it names and leaves
-- this one NULL: a retried notification starts unbound (docs/providers.md says so). That
-- function is not redefined here: 0011 owns it, and a database that had 0011 before this
-- migration arrived must keep 0011's version.
ALTER TABLE nq_queue ADD COLUMN bound_provider text;
ALTER TABLE nq_delivery_log ADD COLUMN bound_provider text;
-- The reading view shows it (a view may gain columns at its end; readers use names).
CREATE OR REPLACE VIEW nq_notifications AS
    SELECT * FROM nq_queue
    UNION ALL
    SELECT * FROM nq_delivery_log;
